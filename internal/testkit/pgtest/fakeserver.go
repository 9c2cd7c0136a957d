package pgtest

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

// FakeServer is a protocol-level stand-in for a server that only looks
// like PostgreSQL: it accepts any startup (trust), sends Params as
// ParameterStatus, answers a simple-protocol query that mentions
// "version()" with Version, and refuses every other statement with an
// error, as CockroachDB does for the settings only PostgreSQL has. It is
// enough to test that such a server is recognised before anything is
// locked; everything else is tested on real PostgreSQL.
type FakeServer struct {
	Version string
	Params  map[string]string

	ln      net.Listener
	mu      sync.Mutex
	conns   []net.Conn
	queries []string
	wg      sync.WaitGroup
}

// StartFakeServer listens on loopback until t ends and returns the server;
// its URL connects to it.
func StartFakeServer(t testing.TB, version string, params map[string]string) *FakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &FakeServer{Version: version, Params: params, ln: ln}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// URL connects to the fake server.
func (s *FakeServer) URL() string {
	return fmt.Sprintf("postgres://fake@%s/fake?sslmode=disable", s.ln.Addr())
}

// Queries lists the statements clients sent, in order.
func (s *FakeServer) Queries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.queries...)
}

func (s *FakeServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer c.Close()
			_ = s.serve(c)
		}()
	}
}

func (s *FakeServer) serve(c net.Conn) error {
	be := pgproto3.NewBackend(c, c)
	for {
		msg, err := be.ReceiveStartupMessage()
		if err != nil {
			return err
		}
		if _, ok := msg.(*pgproto3.SSLRequest); ok {
			if _, err := c.Write([]byte("N")); err != nil {
				return err
			}
			continue
		}
		break
	}
	be.Send(&pgproto3.AuthenticationOk{})
	// pgx needs these two to use the simple protocol.
	params := map[string]string{"standard_conforming_strings": "on", "client_encoding": "UTF8"}
	for k, v := range s.Params {
		params[k] = v
	}
	for k, v := range params {
		be.Send(&pgproto3.ParameterStatus{Name: k, Value: v})
	}
	be.Send(&pgproto3.BackendKeyData{ProcessID: 4242, SecretKey: []byte{1, 2, 3, 4}})
	be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if err := be.Flush(); err != nil {
		return err
	}
	failed := false // an extended-protocol error skips to the next Sync
	for {
		msg, err := be.Receive()
		if err != nil {
			return err
		}
		switch m := msg.(type) {
		case *pgproto3.Query:
			s.record(m.String)
			if strings.Contains(m.String, "version()") {
				be.Send(&pgproto3.RowDescription{Fields: []pgproto3.FieldDescription{{Name: []byte("version"), DataTypeOID: 25, DataTypeSize: -1, TypeModifier: -1}}})
				be.Send(&pgproto3.DataRow{Values: [][]byte{[]byte(s.Version)}})
				be.Send(&pgproto3.CommandComplete{CommandTag: []byte("SELECT 1")})
			} else {
				be.Send(s.refusal())
			}
			be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		case *pgproto3.Parse:
			s.record(m.Query)
			if !failed {
				be.Send(s.refusal())
				failed = true
			}
		case *pgproto3.Sync:
			failed = false
			be.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		case *pgproto3.Terminate:
			return nil
		}
		if err := be.Flush(); err != nil {
			return err
		}
	}
}

func (s *FakeServer) record(q string) {
	s.mu.Lock()
	s.queries = append(s.queries, q)
	s.mu.Unlock()
}

func (s *FakeServer) refusal() *pgproto3.ErrorResponse {
	return &pgproto3.ErrorResponse{Severity: "ERROR", Code: "0A000", Message: "unimplemented: the fake server answers only version()"}
}
