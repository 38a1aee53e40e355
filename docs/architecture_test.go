package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestArchitectureNamesExist: every backticked Go name in ARCHITECTURE.md —
// `pkg.Name`, `Type.Member`, `pkg.Type.Member` and single camelCase names
// such as `claimLoop` — is declared in this module, and every path it names
// under a top-level folder exists, so that the map cannot drift from the
// code unnoticed. A member is a method, a field or an interface method,
// promoted ones included; a single name is any declaration, member or
// top-level. The worker SDKs are named by folder, not by identifier.
func TestArchitectureNamesExist(t *testing.T) {
	doc, err := os.ReadFile("ARCHITECTURE.md")
	if err != nil {
		t.Fatal(err)
	}
	idx := indexModule(t, "..")
	refs := goRefs(string(doc))
	if len(refs) < 50 {
		t.Fatalf("found only %d Go names in ARCHITECTURE.md: is the extraction broken?", len(refs))
	}
	for _, ref := range refs {
		if !idx.resolves(ref) {
			t.Errorf("ARCHITECTURE.md names `%s`, which the code does not declare", ref)
		}
	}
	paths := repoPaths(t, "..", string(doc))
	if len(paths) < 10 {
		t.Fatalf("found only %d paths in ARCHITECTURE.md: is the extraction broken?", len(paths))
	}
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join("..", p)); err != nil {
			t.Errorf("ARCHITECTURE.md names %s, which does not exist", p)
		}
	}
}

var (
	codeSpan = regexp.MustCompile("`([^`\n]+)`")
	goName   = regexp.MustCompile(`^\*?([A-Za-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*){0,2})(?:\(\))?$`)
	camel    = regexp.MustCompile(`[a-z][A-Z]`)
	// A path: a relative one with at least one slash, after a space, a
	// parenthesis, a backtick or the start of a line.
	pathToken = regexp.MustCompile("(?m)(?:^|[\\s(`])([A-Za-z][A-Za-z0-9_.-]*(?:/[A-Za-z0-9_.-]+)+/?)")
	fileExts  = []string{"go", "md", "ts", "py", "proto", "sql", "yaml", "yml", "json", "mod", "html"}
)

// goRefs returns the Go names among the document's code spans, outside
// fenced blocks: dotted names (not file names), and single names that are
// camelCase (`claimLoop`, `HasWork`), which plain words and SQL are not.
func goRefs(doc string) []string {
	var refs []string
	fenced := false
	for line := range strings.Lines(doc) {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(line, -1) {
			g := goName.FindStringSubmatch(m[1])
			if g == nil {
				continue
			}
			name := g[1]
			parts := strings.Split(name, ".")
			if len(parts) > 1 && slices.Contains(fileExts, parts[len(parts)-1]) {
				continue // a file name
			}
			if len(parts) == 1 && !camel.MatchString(name) {
				continue
			}
			refs = append(refs, name)
		}
	}
	return refs
}

// repoPaths returns the paths the document names, in prose, code spans and
// fenced blocks alike, whose first element is a top-level entry of the
// repository at root (others, such as R14/R16, are not paths).
func repoPaths(t *testing.T, root, doc string) []string {
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]bool{}
	for _, e := range entries {
		top[e.Name()] = true
	}
	var out []string
	for _, m := range pathToken.FindAllStringSubmatch(doc, -1) {
		p := strings.TrimRight(m[1], ".,:;")
		if first, _, _ := strings.Cut(p, "/"); top[first] {
			out = append(out, p)
		}
	}
	return out
}

// index is what the module declares: by package name, its top-level
// names; by package name and type, the type's members and embedded types.
type index struct {
	top      map[string]map[string]bool            // package → top-level names
	members  map[string]map[string]map[string]bool // package → type → members
	embedded map[string]map[string][]typeRef       // package → type → embedded types
	anyName  map[string]bool                       // every declared name and member
}

type typeRef struct{ pkg, name string }

// indexModule parses every Go file of the module at root and of the
// workspace's other modules (go.work: the generated code and the Go SDK),
// tests and generated code included, leaving out the nested modules the
// workspace does not use (tools, the River harness).
func indexModule(t *testing.T, root string) *index {
	idx := &index{top: map[string]map[string]bool{}, members: map[string]map[string]map[string]bool{},
		embedded: map[string]map[string][]typeRef{}, anyName: map[string]bool{}}
	used := workspaceModules(t, root)
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "node_modules" || name == "testdata") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != root && err == nil && !used[path] {
				return filepath.SkipDir // another module, not the workspace's
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		idx.add(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return idx
}

func (x *index) add(f *ast.File) {
	pkg := f.Name.Name
	if x.top[pkg] == nil {
		x.top[pkg], x.members[pkg], x.embedded[pkg] = map[string]bool{}, map[string]map[string]bool{},
			map[string][]typeRef{}
	}
	member := func(typ, name string) {
		if x.members[pkg][typ] == nil {
			x.members[pkg][typ] = map[string]bool{}
		}
		x.members[pkg][typ][name] = true
		x.anyName[name] = true
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				x.top[pkg][d.Name.Name] = true
				x.anyName[d.Name.Name] = true
				continue
			}
			if recv := typeName(d.Recv.List[0].Type); recv.name != "" {
				member(recv.name, d.Name.Name)
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						x.top[pkg][n.Name] = true
						x.anyName[n.Name] = true
					}
				case *ast.TypeSpec:
					x.top[pkg][s.Name.Name] = true
					x.anyName[s.Name.Name] = true
					var fields []*ast.Field
					switch tt := s.Type.(type) {
					case *ast.StructType:
						fields = tt.Fields.List
					case *ast.InterfaceType:
						fields = tt.Methods.List
					}
					for _, fl := range fields {
						for _, n := range fl.Names {
							member(s.Name.Name, n.Name)
						}
						if len(fl.Names) == 0 { // embedded
							if ref := typeName(fl.Type); ref.name != "" {
								member(s.Name.Name, ref.name)
								if ref.pkg == "" {
									ref.pkg = pkg
								}
								x.embedded[pkg][s.Name.Name] = append(x.embedded[pkg][s.Name.Name], ref)
							}
						}
					}
				}
			}
		}
	}
}

// typeName is the type a receiver or an embedded field names, without
// pointer and type arguments; pkg is set when it is qualified.
func typeName(e ast.Expr) typeRef {
	switch t := e.(type) {
	case *ast.StarExpr:
		return typeName(t.X)
	case *ast.IndexExpr:
		return typeName(t.X)
	case *ast.IndexListExpr:
		return typeName(t.X)
	case *ast.Ident:
		return typeRef{name: t.Name}
	case *ast.SelectorExpr:
		if p, ok := t.X.(*ast.Ident); ok {
			return typeRef{pkg: p.Name, name: t.Sel.Name}
		}
	}
	return typeRef{}
}

// hasMember reports whether type typ of package pkg has member m, directly
// or promoted from a type it embeds.
func (x *index) hasMember(pkg, typ, m string, depth int) bool {
	if x.members[pkg][typ][m] {
		return true
	}
	if depth > 4 {
		return false
	}
	for _, e := range x.embedded[pkg][typ] {
		if x.hasMember(e.pkg, e.name, m, depth+1) {
			return true
		}
	}
	return false
}

// resolves reports whether ref names a declaration: pkg.Type.Member,
// pkg.Name or Type.Member, or a single name declared anywhere.
func (x *index) resolves(ref string) bool {
	parts := strings.Split(ref, ".")
	switch len(parts) {
	case 1:
		return x.anyName[parts[0]]
	case 2:
		if x.top[parts[0]][parts[1]] {
			return true
		}
		for pkg := range x.members {
			if x.top[pkg][parts[0]] && x.hasMember(pkg, parts[0], parts[1], 0) {
				return true
			}
		}
		return false
	default:
		return x.top[parts[0]][parts[1]] && x.hasMember(parts[0], parts[1], parts[2], 0)
	}
}

// workspaceModules is the set of directories go.work at root uses.
func workspaceModules(t *testing.T, root string) map[string]bool {
	b, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatalf("read go.work: %v", err)
	}
	used := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(strings.TrimPrefix(strings.TrimSpace(line), "use"))
		if len(f) == 1 && strings.HasPrefix(f[0], "./") {
			used[filepath.Join(root, f[0])] = true
		}
	}
	return used
}
