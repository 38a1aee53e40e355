package store

import (
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strconv"
	"strings"
)

// Migration is one numbered SQL file of a backend's schema.
type Migration struct {
	Version    int
	Name       string
	Statements []string
	// Contract marks a migration that removes what an earlier release still
	// uses (an index its queries name), named NNNN_name.contract.sql. It is
	// applied with the rest on a fresh database; on one that a fleet is
	// running on, only when asked (coordinator --migrate-contract), once
	// every coordinator runs a release that no longer needs what it removes.
	Contract bool
}

// contractSuffix ends the file name of a contract migration.
const contractSuffix = ".contract.sql"

// Migrations reads the files NNNN_name.sql in dir of fsys, in version order,
// each split into statements on a ';' that ends a line. Comment lines ("--")
// are dropped. Every backend embeds its own files and applies them under its
// own lock.
func Migrations(fsys fs.FS, dir string) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var out []Migration
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".sql") {
			continue
		}
		num, _, ok := strings.Cut(name, "_")
		version, err := strconv.Atoi(num)
		if !ok || err != nil || version <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_description.sql", name)
		}
		body, err := fs.ReadFile(fsys, path.Join(dir, name))
		if err != nil {
			return nil, err
		}
		out = append(out, Migration{Version: version, Name: name, Statements: splitSQL(string(body)),
			Contract: strings.HasSuffix(name, contractSuffix)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i := 1; i < len(out); i++ {
		if out[i].Version == out[i-1].Version {
			return nil, fmt.Errorf("migrations %s and %s share version %d", out[i-1].Name, out[i].Name, out[i].Version)
		}
	}
	return out, nil
}

func splitSQL(body string) []string {
	var stmts []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
		if strings.HasSuffix(trimmed, ";") {
			stmts = append(stmts, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		stmts = append(stmts, s)
	}
	return stmts
}
