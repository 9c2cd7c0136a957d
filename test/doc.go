// Package test holds pgbaton's cross-package integration, fault-injection
// and load tests. It has no code of its own outside _test.go files.
package test
