package connlimit

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"
)

// An HTTP server over a Listener sets ConnContext and wraps its handler
// with Handler: every request marks its connection Established, and a
// connection in the Listener's reserve is answered only if its request is
// one the server answers at once (a probe).

type connKey struct{}

// ConnContext is an http.Server's ConnContext for a server over a
// Listener: it keeps the admitted connection in each request's context,
// for Handler.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if ac := Of(c); ac != nil {
		return context.WithValue(ctx, connKey{}, ac)
	}
	return ctx
}

// reserveRefusal is the answer on a reserve slot to anything but a probe.
const reserveRefusal = "busy: every connection slot is taken; only the probes are served now\n"

// Handler serves h over a Listener's connections (with ConnContext). A
// request marks its connection Established. On a Reserved connection only
// a request probe accepts, without a body, is served, and the connection
// is closed after it; any other request is answered 503 and its
// connection closed at once, without reading its body, so slow peers
// cannot hold the reserve.
func Handler(h http.Handler, probe func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(*Conn)
		if c == nil {
			h.ServeHTTP(w, r)
			return
		}
		if c.Reserved() {
			if !probe(r) || r.ContentLength != 0 {
				refuse(w)
				return
			}
			w.Header().Set("Connection", "close")
		}
		c.Establish()
		h.ServeHTTP(w, r)
	})
}

// refuse answers 503 on the raw connection and closes it, so net/http does
// not wait for the rest of the request's body.
func refuse(w http.ResponseWriter) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil { // not HTTP/1: an ordinary answer, and close
		w.Header().Set("Connection", "close")
		http.Error(w, reserveRefusal, http.StatusServiceUnavailable)
		return
	}
	defer conn.Close()
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	io.WriteString(buf, "HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n"+
		"Content-Length: "+strconv.Itoa(len(reserveRefusal))+"\r\n\r\n"+reserveRefusal)
	buf.Flush()
}
