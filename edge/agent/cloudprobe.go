package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kubeedge/api/apis/common/constants"
	"golang.org/x/net/http2"
	"sigs.k8s.io/yaml"
)

// CloudProbe tells whether the node reaches the cloud by a request to a URL there: the API server's /readyz, or
// the cloudcore endpoint edgecore's edgeHub connects to. Any HTTP answer counts: only the round trip matters. It
// is needed when the agent reads its workers from KubeEdge's MetaServer, which answers from the node's own store
// whether or not the cloud is reachable, and it is how a cut is seen fast: a watch on a dead link tells only when
// TCP gives up.
//
// A cut is told at most Period + Timeout after it begins. Attempts are frequent, so they must cost the cloud
// nothing: over HTTP/2 the probe keeps one connection, sends the URL's request once on it, and then a PING frame
// per attempt, which the server's framer answers without a request, a handler or an authentication.
type CloudProbe struct {
	URL string
	// TLS checks the cloud's certificate; nil: not checked (nothing read from the answer is trusted).
	TLS *tls.Config
	// Timeout of one attempt (default 1 s): longer than the link's worst round trip, or a slow link is taken for
	// a cut one.
	Timeout time.Duration
	// Period between attempts (default 250 ms).
	Period time.Duration

	reachable atomic.Bool
	probed    atomic.Bool // an attempt has ended
	initOnce  sync.Once
	changes   chan struct{}
}

// Default timing of the probe.
const (
	DefaultProbeTimeout = time.Second
	DefaultProbePeriod  = 250 * time.Millisecond
)

// Run probes every Period until ctx ends.
func (p *CloudProbe) Run(ctx context.Context) {
	timeout, period := cmp.Or(p.Timeout, DefaultProbeTimeout), cmp.Or(p.Period, DefaultProbePeriod)
	link, badURL := newCloudLink(p.URL, p.TLS)
	defer link.close()
	for {
		err := badURL
		if err == nil {
			attempt, cancel := context.WithTimeout(ctx, timeout)
			err = link.answers(attempt)
			cancel()
		}
		if ctx.Err() != nil {
			return // the attempt was cut short by the end, not by the link
		}
		p.record(err == nil)
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
	}
}

// record keeps an attempt's outcome and tells a change.
func (p *CloudProbe) record(reachable bool) {
	p.init()
	was := p.reachable.Swap(reachable)
	if first := !p.probed.Swap(true); first || was != reachable {
		select {
		case p.changes <- struct{}{}:
		default:
		}
	}
}

func (p *CloudProbe) init() { p.initOnce.Do(func() { p.changes = make(chan struct{}, 1) }) }

// Reachable tells the outcome of the latest attempt.
func (p *CloudProbe) Reachable() bool { return p.reachable.Load() }

// Probed tells whether an attempt has ended, so Reachable means something.
func (p *CloudProbe) Probed() bool { return p.probed.Load() }

// Changes receives after the first attempt and whenever Reachable changes, so that the heartbeat tells a cut as
// soon as it is seen; a change not yet received is not queued twice.
func (p *CloudProbe) Changes() <-chan struct{} {
	p.init()
	return p.changes
}

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

func newCloudLink(rawURL string, tlsConfig *tls.Config) (*cloudLink, error) {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("cloud probe %q is not an http(s) URL", rawURL)
	}
	if tlsConfig == nil {
		// Nothing read from the answer is trusted: only the round trip matters.
		tlsConfig = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12} //nolint:gosec // reachability only
	}
	tlsConfig = tlsConfig.Clone()
	tlsConfig.NextProtos = []string{"h2", "http/1.1"}
	return &cloudLink{url: u, tls: tlsConfig, noHTTP2: u.Scheme == "http", http2: &http2.Transport{},
		http1: &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig, ForceAttemptHTTP2: false, MaxIdleConns: 1}}}, nil
}

// answers tells whether the cloud answered within ctx. A kept connection that fails (the server closed it, or a
// cut) is replaced within the same attempt, so that only a cloud that does not answer a new connection counts.
func (l *cloudLink) answers(ctx context.Context) error {
	if l.conn != nil {
		if l.conn.State().Closing {
			l.dropConn()
		} else if err := l.conn.Ping(ctx); err == nil {
			return nil
		} else {
			l.dropConn()
			if ctx.Err() != nil {
				return err
			}
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

// edgecoreConfig is what the agent reads of edgecore's configuration: where edgeHub reaches cloudcore's HTTPS
// server, and the cloud's CA on the node.
type edgecoreConfig struct {
	Modules struct {
		EdgeHub struct {
			HTTPServer string `json:"httpServer"`
			TLSCAFile  string `json:"tlsCaFile"`
		} `json:"edgeHub"`
		MetaManager struct {
			MetaServer struct {
				Enable bool   `json:"enable"`
				Server string `json:"server"`
			} `json:"metaServer"`
		} `json:"metaManager"`
	} `json:"modules"`
	FeatureGates map[string]bool `json:"featureGates"`
}

// MetaServerCAFile is where edgecore keeps the CA of the MetaServer's serving certificate when the
// requireAuthorization feature gate is on: the API server's CA, fetched from the cloud
// (edge/pkg/metamanager/metaserver/certificate in KubeEdge).
const MetaServerCAFile = "/etc/kubeedge/pki/metaserver/ca.crt"

// MetaServerEndpoint is how edgecore's configuration says the MetaServer is reached.
type MetaServerEndpoint struct {
	// Enabled is modules.metaManager.metaServer.enable: off (edgecore's default), nothing listens.
	Enabled bool
	// URL is http://<server>, or https://<server> under the requireAuthorization feature gate, where the
	// MetaServer authenticates a service-account token and authorizes it by RBAC.
	URL string
	// CAFile verifies the MetaServer's certificate, with https only.
	CAFile string
}

// EdgecoreMetaServer reads where the MetaServer listens, and how, from edgecore's configuration at path.
func EdgecoreMetaServer(path string) (MetaServerEndpoint, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return MetaServerEndpoint{}, fmt.Errorf("reading edgecore's configuration: %w", err)
	}
	var cfg edgecoreConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return MetaServerEndpoint{}, fmt.Errorf("decoding edgecore's configuration %s: %w", path, err)
	}
	ms := cfg.Modules.MetaManager.MetaServer
	server := strings.TrimSpace(ms.Server)
	if server == "" {
		server = constants.DefaultMetaServerAddr
	}
	ep := MetaServerEndpoint{Enabled: ms.Enable, URL: "http://" + server}
	if cfg.FeatureGates["requireAuthorization"] {
		ep.URL, ep.CAFile = "https://"+server, MetaServerCAFile
	}
	return ep, nil
}

// EdgecoreProbe is the probe of cloudcore that edgecore's configuration at path implies: a GET of
// <modules.edgeHub.httpServer>/ca.crt, which cloudcore's HTTPS server (10002) answers without a client
// certificate; its websocket port (10000) requires one and never answers the agent. The server's certificate is
// checked against the cloud's CA that edgecore's tlsCaFile names (default /etc/kubeedge/ca/rootCA.crt), by chain
// only: edgecore may reach cloudcore by an address its certificate does not name. Without that file it is not
// checked; the message says why that is acceptable. It returns an error when the configuration names no server.
func EdgecoreProbe(path string) (*CloudProbe, string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", fmt.Errorf("reading edgecore's configuration: %w", err)
	}
	var cfg edgecoreConfig
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return nil, "", fmt.Errorf("decoding edgecore's configuration %s: %w", path, err)
	}
	hub := cfg.Modules.EdgeHub
	server, err := url.Parse(strings.TrimSpace(hub.HTTPServer))
	if err != nil || server.Scheme != "https" || server.Host == "" {
		return nil, "", fmt.Errorf("edgecore's configuration %s: modules.edgeHub.httpServer %q is not an https URL", path, hub.HTTPServer)
	}
	probe := &CloudProbe{URL: strings.TrimSuffix(server.String(), "/") + "/ca.crt"}
	caFile := hub.TLSCAFile
	if caFile == "" {
		caFile = constants.DefaultCAFile
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return probe, fmt.Sprintf("the cloud's certificate is not checked (%v): nothing read from the answer is trusted, and a "+
			"forged answer, which takes a place on the node's path to the cloud, can only make a cut-off node look connected", err), nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, "", fmt.Errorf("the cloud's CA %s holds no certificate", caFile)
	}
	probe.TLS = chainOnlyTLS(pool)
	return probe, "the cloud's certificate is checked against " + caFile, nil
}

// chainOnlyTLS verifies the server's certificate chain against roots, whatever name it was reached by.
func chainOnlyTLS(roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		InsecureSkipVerify: true, //nolint:gosec // the chain is verified below, only the name is not
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("the cloud sent no certificate")
			}
			intermediates := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates})
			return err
		},
	}
}
