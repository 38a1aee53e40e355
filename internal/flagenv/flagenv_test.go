package flagenv

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func TestApplyFillsUngivenFlags(t *testing.T) {
	t.Setenv("APP_LEASE_TIME", "45s")
	t.Setenv("APP_NAME", "from-env")
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	lease := fs.Duration("lease-time", time.Second, "")
	name := fs.String("name", "default", "")
	if err := fs.Parse([]string{"-name", "from-flag"}); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, "APP"); err != nil {
		t.Fatal(err)
	}
	if *lease != 45*time.Second {
		t.Fatalf("lease = %v, want the environment's 45s", *lease)
	}
	if *name != "from-flag" {
		t.Fatalf("name = %q: a flag on the command line wins over the environment", *name)
	}
}

func TestApplyNamesBadVariable(t *testing.T) {
	t.Setenv("APP_COUNT", "not-a-number")
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	fs.Int("count", 1, "")
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if err := Apply(fs, "APP"); err == nil || !strings.Contains(err.Error(), "APP_COUNT") {
		t.Fatalf("Apply = %v, want an error naming APP_COUNT", err)
	}
}
