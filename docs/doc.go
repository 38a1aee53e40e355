// Package docs holds the project's documents; its tests keep what they say
// about the code true to the code (architecture_test.go: every Go name and
// path ARCHITECTURE.md gives exists).
package docs
