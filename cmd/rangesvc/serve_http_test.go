package main

import (
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/snowflake"
)

// httpGet fetches url and returns the status, Content-Type and body.
func httpGet(t *testing.T, url string) (int, string, []byte) {
	t.Helper()
	resp, body := testenv.HTTPGet(t, url, 30*time.Second)
	return resp.StatusCode, resp.Header.Get("Content-Type"), body
}

var mintedRE = regexp.MustCompile(`(?m)^idrange_service_minted_ids_total (\S+)$`)

// minted reads idrange_service_minted_ids_total from the replica.
func minted(t *testing.T, p *testenv.Process) float64 {
	t.Helper()
	m := mintedRE.FindStringSubmatch(p.Scrape(t))
	if m == nil {
		t.Fatal("idrange_service_minted_ids_total not exported")
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The acceptance, against a real `rangesvc serve` over net/http:
// 10 calls of count=1000 give 10,000 unique IDs of the replica's region as
// JSON strings; count=0, -1, 1e9 and abc each give a 400 with a JSON error
// (gRPC code and message) naming the parameter, and mint nothing.
func TestHTTPMintAcceptance(t *testing.T) {
	const region = 2
	p := testenv.StartServe(t, testenv.ServeConfig{Region: region})
	if p.HTTPAddr == "" {
		t.Fatalf("no http api listening line in:\n%s", p.Stderr())
	}
	base := "http://" + p.HTTPAddr + "/v1/ids?count="

	badCounts := func() {
		t.Helper()
		for _, bad := range []string{"0", "-1", "1e9", "abc"} {
			code, ctype, body := httpGet(t, base+bad)
			var e struct {
				Code    codes.Code `json:"code"`
				Message string     `json:"message"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("count=%s: body %q is not a JSON error: %v", bad, body, err)
			}
			if code != http.StatusBadRequest || !strings.HasPrefix(ctype, "application/json") ||
				e.Code != codes.InvalidArgument || !strings.Contains(e.Message, "count") || strings.Contains(e.Message, "\n") {
				t.Errorf("count=%s: %d %s %+v; want 400 application/json, code %d, a one-line message naming count",
					bad, code, ctype, e, codes.InvalidArgument)
			}
		}
	}
	// Bad counts first, on a replica that has minted nothing: its minter
	// (opened on first use) must not even be opened for them.
	badCounts()
	if n := minted(t, p); n != 0 {
		t.Fatalf("minted_ids_total = %v after bad counts only", n)
	}
	if strings.Contains(p.Stderr(), "lease acquired") {
		t.Fatalf("a bad count opened the replica's minter:\n%s", p.Stderr())
	}

	seen := make(map[snowflake.ID]bool, 10_000)
	for call := range 10 {
		code, ctype, body := httpGet(t, base+"1000")
		if code != http.StatusOK || !strings.HasPrefix(ctype, "application/json") {
			t.Fatalf("call %d: %d %s: %s", call, code, ctype, body)
		}
		var resp struct {
			IDs []json.RawMessage `json:"ids"`
		}
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		if len(resp.IDs) != 1000 {
			t.Fatalf("call %d: %d IDs, want 1000", call, len(resp.IDs))
		}
		ids := make([]snowflake.ID, len(resp.IDs))
		for i, raw := range resp.IDs {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatalf("call %d: ID %s is not a JSON string", call, raw)
			}
			id, err := snowflake.Parse(s)
			if err != nil {
				t.Fatalf("call %d: ID %q: %v", call, s, err)
			}
			ids[i] = id
		}
		checkIDs(t, region, seen, ids)
	}
	if len(seen) != 10_000 {
		t.Fatalf("%d unique IDs, want 10000", len(seen))
	}
	if !strings.Contains(p.Stderr(), "lease acquired") {
		t.Fatal(`the minter's "lease acquired" log line is missing: the check above proves nothing`)
	}
	badCounts()
	if n := minted(t, p); n != 10_000 {
		t.Fatalf("minted_ids_total = %v, want 10000: bad counts minted", n)
	}

	// The limit itself is the service's, over HTTP too.
	code, _, body := httpGet(t, base+strconv.Itoa(service.MaxMintBatch+1))
	if code != http.StatusBadRequest || !strings.Contains(string(body), strconv.Itoa(service.MaxMintBatch)) {
		t.Fatalf("count=%d: %d %s; want 400 naming the limit", service.MaxMintBatch+1, code, body)
	}
	// Only the HTTP bindings are served: no other method, no other protocol.
	if code, _, body := httpGet(t, "http://"+p.HTTPAddr+"/idrange.v1.RangeService/GetReplicaInfo"); code != http.StatusNotFound {
		t.Fatalf("Connect-style path: %d %s; want 404", code, body)
	}
}

// --http takes host:port (bad: exit 2 naming the flag); empty disables it.
func TestHTTPFlag(t *testing.T) {
	for _, bad := range []string{"nonsense", "127.0.0.1:70000"} {
		code, _, errs := runCmd("serve", "--region", "0", "--http", bad)
		if code != cli.ExitUsage || !strings.Contains(errs, "--http") {
			t.Errorf("--http %q: exit %d, stderr %q; want %d naming --http", bad, code, errs, cli.ExitUsage)
		}
	}
	c, err := parseServeFlags([]string{"--region", "0", "--http", ""}, io.Discard)
	if err != nil || c.HTTP != "" {
		t.Fatalf("--http '': %q, %v; want disabled", c.HTTP, err)
	}
	if a, err := startHTTPAPI(c.HTTP, connLimits{}, nil, nil, nil, nil); a != nil || err != nil {
		t.Fatalf("startHTTPAPI with --http '': %v, %v; want nothing started", a, err)
	}
	c, err = parseServeFlags([]string{"--region", "0"}, io.Discard)
	if err != nil || c.HTTP != defaultHTTP {
		t.Fatalf("default --http %q, %v; want %s", c.HTTP, err, defaultHTTP)
	}
}
