package cloudlink

//lint:file-ignore SA1019 net/http's ClientConn (Go 1.26) sends no PING frame; x/net/http2's is the one that does.

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"

	"golang.org/x/net/http2"
)

// cloudLink is the probe's connection to the cloud: an HTTP/2 connection PINGed once it has answered the URL's
// request, or (HTTP/1, or a server without HTTP/2) the URL's request on a kept-alive connection each time.
type cloudLink struct {
	url     *url.URL
	tls     *tls.Config
	http1   *http.Client
	http2   *http2.Transport
	conn    *http2.ClientConn
	noHTTP2 bool
}

// ParseProbeURL parses a cloud probe's URL, refusing one that is not http(s) with a host.
func ParseProbeURL(rawURL string) (*url.URL, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) URL", rawURL)
	}
	return u, nil
}

func newCloudLink(rawURL string, tlsConfig *tls.Config) (*cloudLink, error) {
	u, err := ParseProbeURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("cloud probe: %w", err)
	}
	if tlsConfig == nil {
		// Nothing read from the answer is trusted: only the round trip matters.
		tlsConfig = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // reachability only
	}
	either, http1Only := tlsConfig.Clone(), tlsConfig.Clone()
	either.NextProtos, http1Only.NextProtos = []string{"h2", "http/1.1"}, []string{"http/1.1"}
	return &cloudLink{url: u, tls: either, noHTTP2: u.Scheme == "http", http2: &http2.Transport{},
		http1: &http.Client{Transport: &http.Transport{TLSClientConfig: http1Only, MaxIdleConns: 1}}}, nil
}

// answers tells whether the cloud answered within ctx. A kept connection that fails (the server closed it, or a
// cut) is replaced within the same attempt, so that only a cloud that does not answer a new connection counts.
func (l *cloudLink) answers(ctx context.Context) error {
	if l.conn != nil {
		if !l.conn.State().Closing && l.conn.Ping(ctx) == nil {
			return nil
		}
		l.dropConn()
		if err := ctx.Err(); err != nil {
			return err // the attempt's time is up: no new connection
		}
	}
	if l.noHTTP2 {
		return l.get(ctx, l.http1.Do)
	}
	conn, err := (&tls.Dialer{Config: l.tls}).DialContext(ctx, "tcp", l.hostPort())
	if err != nil {
		return err
	}
	if conn.(*tls.Conn).ConnectionState().NegotiatedProtocol != "h2" {
		conn.Close()
		l.noHTTP2 = true
		return l.get(ctx, l.http1.Do)
	}
	cc, err := l.http2.NewClientConn(conn)
	if err != nil {
		conn.Close()
		return err
	}
	if err := l.get(ctx, cc.RoundTrip); err != nil {
		cc.Close()
		return err
	}
	l.conn = cc
	return nil
}

// get sends the URL's request and reads a little of any answer.
func (l *cloudLink) get(ctx context.Context, send func(*http.Request) (*http.Response, error)) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, l.url.String(), nil)
	if err != nil {
		return err
	}
	resp, err := send(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return resp.Body.Close()
}

func (l *cloudLink) hostPort() string {
	if l.url.Port() != "" {
		return l.url.Host
	}
	return net.JoinHostPort(l.url.Hostname(), "443")
}

func (l *cloudLink) dropConn() {
	if l.conn != nil {
		l.conn.Close()
		l.conn = nil
	}
}

func (l *cloudLink) close() {
	if l != nil {
		l.dropConn()
		l.http1.CloseIdleConnections()
	}
}
