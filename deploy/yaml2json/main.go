// Command yaml2json reads one YAML document on stdin and writes it as JSON on
// stdout, so that the project's tests can check docker-compose.yml with
// encoding/json alone. It is a module of its own to keep its YAML dependency
// out of the coordinator's module graph.
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

func main() {
	in, err := io.ReadAll(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "yaml2json:", err)
		os.Exit(1)
	}
	var doc any
	if err := yaml.Unmarshal(in, &doc); err != nil {
		fmt.Fprintln(os.Stderr, "yaml2json:", err)
		os.Exit(1)
	}
	if err := json.NewEncoder(os.Stdout).Encode(doc); err != nil {
		fmt.Fprintln(os.Stderr, "yaml2json:", err)
		os.Exit(1)
	}
}
