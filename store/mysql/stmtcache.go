package mysql

import (
	"container/list"
	"context"
	"database/sql/driver"
	"errors"
	"hash/maphash"

	"github.com/go-sql-driver/mysql"
)

// keptPerConn is how many prepared statements a connection keeps: about the
// statement shapes a busy coordinator cycles through (a batch's IN list and
// CASE arms grow with its size). A coordinator with the default pool of 32
// keeps at most 2,048 on the server, whose max_prepared_stmt_count (16,382
// by default) bounds every client together; once the server refuses one, a
// connection runs its statements as text.
const keptPerConn = 64

// preparedConnector hands out connections that run statements with
// arguments as server-side prepared statements: a statement is prepared the
// second time a connection runs it and kept for its next use, the least
// recently used closed beyond keptPerConn. The server then parses a claim's candidate query or a
// write-back's UPDATE once per connection instead of once per call: parsing
// was 15 % of MariaDB's CPU under claim load, and a prepared candidate query
// costs it a fifth less CPU than the same query as text. A statement the
// server refuses to prepare runs as text, as it would without this.
type preparedConnector struct {
	driver.Connector
	keep int
}

func (c preparedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &preparedConn{conn: dc.(mysqlDriverConn), keep: c.keep, stmts: map[string]*list.Element{}, lru: list.New(),
		text: map[string]bool{}, seen: map[uint64]bool{}}, nil
}

// mysqlDriverConn is what go-sql-driver's connection implements and a
// preparedConn passes on.
type mysqlDriverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	driver.NamedValueChecker
}

// preparedConn is a connection with its kept statements. database/sql uses
// a connection from one goroutine at a time, so it needs no lock.
type preparedConn struct {
	conn  mysqlDriverConn
	keep  int
	stmts map[string]*list.Element // of *keptStmt, most recently used at the front of lru
	lru   *list.List
	// next is the kept statement of the query whose QueryContext or
	// ExecContext just answered driver.ErrSkip (useKept).
	next *keptStmt
	// text holds up to keep queries the server would not prepare (a SHOW
	// with a placeholder, say), which run as text without asking again.
	text map[string]bool
	// seen holds the hashes of statements run once as text, up to 4×keep.
	seen map[uint64]bool
	// full is set once the server refused a statement for its
	// max_prepared_stmt_count: this connection then prepares no more.
	full bool
}

// keptStmt is a prepared statement that database/sql closes after each use
// without it being closed on the server.
type keptStmt struct {
	driver.Stmt
	query string
}

func (s *keptStmt) Close() error { return nil }

func (s *keptStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.Stmt.(driver.StmtExecContext).ExecContext(ctx, args)
}

func (s *keptStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.Stmt.(driver.StmtQueryContext).QueryContext(ctx, args)
}

func (s *keptStmt) CheckNamedValue(nv *driver.NamedValue) error {
	return s.Stmt.(driver.NamedValueChecker).CheckNamedValue(nv)
}

// kept returns the statement kept for query, preparing it (and closing the
// least recently used beyond keep) when it is new; nil when the query has no
// arguments or the server would not prepare it: it then runs as text.
func (c *preparedConn) kept(ctx context.Context, query string, args []driver.NamedValue) (*keptStmt, error) {
	if len(args) == 0 || c.full {
		return nil, nil
	}
	if e, ok := c.stmts[query]; ok { // the usual case: one lookup of the query
		c.lru.MoveToFront(e)
		return e.Value.(*keptStmt), nil
	}
	if c.text[query] {
		return nil, nil
	}
	// A statement is prepared the second time the connection runs it: a
	// batch's shape seen once (its IN list and CASE arms grow with its
	// size) runs as text instead of displacing a kept one.
	h := maphash.String(seed, query)
	if !c.seen[h] {
		if len(c.seen) >= 4*c.keep {
			clear(c.seen)
		}
		c.seen[h] = true
		return nil, nil
	}
	st, err := c.conn.PrepareContext(ctx, query)
	var me *mysql.MySQLError
	switch {
	case errors.As(err, &me):
		c.full = me.Number == errTooManyPrepared
		if len(c.text) < c.keep {
			c.text[query] = true
		}
		return nil, nil // the server answered: the statement may run as text
	case err != nil:
		return nil, err // the connection failed
	}
	s := &keptStmt{Stmt: st, query: query}
	c.stmts[query] = c.lru.PushFront(s)
	for c.lru.Len() > c.keep {
		old := c.lru.Remove(c.lru.Back()).(*keptStmt)
		delete(c.stmts, old.query)
		if err := old.Stmt.Close(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

var seed = maphash.MakeSeed()

// errTooManyPrepared is the server's ER_MAX_PREPARED_STMT_COUNT_REACHED.
const errTooManyPrepared = 1461

// useKept answers driver.ErrSkip when query is to run as its kept
// statement: database/sql then prepares the query (PrepareContext answers
// with next) and runs it as a statement. nil: it runs as text.
func (c *preparedConn) useKept(ctx context.Context, query string, args []driver.NamedValue) error {
	s, err := c.kept(ctx, query, args)
	switch {
	case err != nil:
		return err
	case s == nil:
		return nil
	}
	c.next = s
	return driver.ErrSkip
}

func (c *preparedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if err := c.useKept(ctx, query, args); err != nil {
		return nil, err
	}
	return c.conn.QueryContext(ctx, query, args)
}

func (c *preparedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if err := c.useKept(ctx, query, args); err != nil {
		return nil, err
	}
	return c.conn.ExecContext(ctx, query, args)
}

func (c *preparedConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if s := c.next; s != nil && s.query == query {
		c.next = nil
		return s, nil
	}
	return c.conn.PrepareContext(ctx, query)
}

func (c *preparedConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}

// Close closes the connection, and with it its statements on the server.
func (c *preparedConn) Close() error { return c.conn.Close() }

func (c *preparedConn) Begin() (driver.Tx, error) { return c.conn.Begin() } //nolint:staticcheck // driver.Conn requires it
func (c *preparedConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.conn.BeginTx(ctx, opts)
}
func (c *preparedConn) Ping(ctx context.Context) error         { return c.conn.Ping(ctx) }
func (c *preparedConn) ResetSession(ctx context.Context) error { return c.conn.ResetSession(ctx) }
func (c *preparedConn) IsValid() bool                          { return c.conn.IsValid() }
func (c *preparedConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.conn.CheckNamedValue(nv)
}
