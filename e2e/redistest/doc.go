// Package redistest starts real redis-server processes for tests.
//
// There are no mocks: Start runs the redis-server binary found on PATH (or at
// the path in the RATELEASE_REDIS_SERVER environment variable) on a free
// 127.0.0.1 port, with its working directory in t.TempDir(), persistence
// disabled (StartWith(Options{Persist: true}) enables RDB snapshots) and
// protected mode on. The process is stopped when the test ends, whether it
// passed or failed.
//
//	func TestSomething(t *testing.T) {
//		srv := redistest.Start(t)
//		rdb := srv.Client(t)
//		// ... use rdb, or srv.Addr() / srv.URL() ...
//	}
//
// Fault tests can stop, kill and restart the server; Restart brings it back
// on the same address. A server started with Start comes back with an empty
// data set; one started with StartWith(Options{Persist: true}) loads its last
// snapshot, which Stop saves and Kill does not.
//
// If redis-server is not installed, Start fails the test with a message
// saying how to install it (`make test` installs it with apt-get when run as
// root).
package redistest
