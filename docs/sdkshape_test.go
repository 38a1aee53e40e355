package docs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// sdkShape is the one file set of the three worker SDKs (docs/ARCHITECTURE.md,
// clients/spec/README.md): the same concern lives under the same name in
// each, so that a change to the protocol is made in the same three places.
var sdkShape = []string{"client", "session", "worker", "job", "renewer", "receipts", "spool",
	"options", "events", "decide", "errors", "types", "tracing"}

// sdkExtras are each language's files outside the shared set: package
// docs and entry points, platform variants, generated code, helpers of one
// language only.
var sdkExtras = map[string][]string{
	"go":     {"doc", "spool_unix", "spool_other"},
	"node":   {"index", "json", "gen"},
	"python": {"__init__", "_rpc", "_googleapis", "v1", "py.typed"},
}

// TestSDKsShareOneShape: each SDK has every file of the shared set and
// nothing else but its language's extras, so a fourth concern cannot grow in
// one SDK only, nor one file of the set go missing in one.
func TestSDKsShareOneShape(t *testing.T) {
	sdks := map[string]struct{ dir, ext string }{
		"go":     {"../clients/go/jobfence", ".go"},
		"node":   {"../clients/node/src", ".ts"},
		"python": {"../clients/python/src/jobfence", ".py"},
	}
	for lang, sdk := range sdks {
		entries, err := os.ReadDir(sdk.dir)
		if err != nil {
			t.Fatal(err)
		}
		var have []string
		for _, e := range entries {
			name := e.Name()
			if strings.HasSuffix(name, "_test.go") || strings.HasPrefix(name, ".") || name == "__pycache__" {
				continue
			}
			if !e.IsDir() && filepath.Ext(name) == sdk.ext {
				name = strings.TrimSuffix(name, sdk.ext)
			}
			have = append(have, name)
		}
		for _, want := range sdkShape {
			if !slices.Contains(have, want) {
				t.Errorf("%s SDK (%s) lacks %s%s, a file of the shared set", lang, sdk.dir, want, sdk.ext)
			}
		}
		for _, name := range have {
			if !slices.Contains(sdkShape, name) && !slices.Contains(sdkExtras[lang], name) {
				t.Errorf("%s SDK (%s) has %s outside the shared set and its language's extras: "+
					"give it a place in the set (in all three SDKs) or name it an extra here", lang, sdk.dir, name)
			}
		}
	}
}
