// Package flagenv lets every flag of a command fall back to an environment
// variable, so the same binary is configured by flags on a laptop and by
// environment in a container.
package flagenv

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Name is the variable standing in for the flag name: prefix, '_', the name
// in upper case with '-' as '_' (lease-until → PREFIX_LEASE_UNTIL).
func Name(prefix, flagName string) string {
	return prefix + "_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// Apply sets every flag of the parsed fs that was not given on the command
// line from its variable, when that is set. A bad value fails naming the
// variable.
func Apply(fs *flag.FlagSet, prefix string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := Name(prefix, f.Name)
		if v, ok := os.LookupEnv(name); ok && !given[f.Name] && err == nil {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s: %w", name, e)
			}
		}
	})
	return err
}
