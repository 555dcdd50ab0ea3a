package desired

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// Pod is what the agent keeps of a pod: its identity, the marks it reads, its node, and its static-pod manifest
// when that is within MaxManifestBytes. Decoding only this, with the standard library, keeps the agent free of
// Kubernetes' client libraries (and small); everything else a pod carries (other labels and annotations, other
// environment values) is dropped as it is decoded, so a tenant's megabyte of annotations costs the agent nothing
// once its pod is read.
type Pod struct {
	Metadata struct {
		Namespace       string            `json:"namespace"`
		Name            string            `json:"name"`
		UID             string            `json:"uid"`
		ResourceVersion string            `json:"resourceVersion"`
		Labels          map[string]string `json:"labels"`
		Annotations     map[string]string `json:"annotations"`
	} `json:"metadata"`
	Spec struct {
		NodeName      string `json:"nodeName"`
		RestartPolicy string `json:"restartPolicy"`
		Containers    []struct {
			Env []struct {
				Name  string `json:"name"`
				Value string `json:"value"`
			} `json:"env"`
		} `json:"containers"`
	} `json:"spec"`
	Status struct {
		Phase string `json:"phase"`
	} `json:"status"`
	// Manifest is the pod as a static-pod manifest (staticManifest's), "" when it cannot be read that way or
	// when it is larger than MaxManifestBytes.
	Manifest string `json:"-"`
	// ManifestBytes is the manifest's size, kept when the manifest itself is dropped for it.
	ManifestBytes int `json:"-"`
}

// The agent's bounds on what the node's pods may cost it. A pod is at most about 1.5 MiB in an API server
// (etcd's default request limit), and a tenant may bind a few dozen such pods to a node: kept whole, they
// would take the agent past its memory limit, and with it the heartbeats and the offline healing of every
// tenant of the node.
const (
	// MaxPodBytes bounds one pod (or watch event) as read from the pod source: no API server sends a larger
	// one, and a source that does is not one; the list or watch fails.
	MaxPodBytes = 3 << 20
	// MaxManifestBytes, MaxDesiredBytes and MaxWorkers are the protocol's [P-DES-3], held to every pod source.
	MaxManifestBytes = lifelinev1.MaxManifestBytes
	MaxDesiredBytes  = lifelinev1.MaxDesiredBytes
	MaxWorkers       = lifelinev1.MaxWorkers
	maxMarkBytes     = lifelinev1.MaxMarkBytes
)

// UnmarshalJSON decodes the fields above, keeps of the labels, annotations and environment only what the agent
// reads (the role label, Lifeline's and the mirror pod's annotations, WORKER_NAME), each within maxMarkBytes,
// and makes the pod's static-pod manifest.
func (p *Pod) UnmarshalJSON(data []byte) error {
	type fields Pod // without this method
	if err := json.Unmarshal(data, (*fields)(p)); err != nil {
		return err
	}
	m := &p.Metadata
	m.Labels = keptMarks(m.Labels, func(k string) bool { return k == lifelinev1.RoleLabel })
	m.Annotations = keptMarks(m.Annotations, func(k string) bool {
		return k == mirrorAnnotation || strings.HasPrefix(k, lifelinev1.MarkPrefix)
	})
	for i := range p.Spec.Containers {
		env := p.Spec.Containers[i].Env[:0]
		for _, e := range p.Spec.Containers[i].Env {
			if e.Name == "WORKER_NAME" && len(e.Value) <= maxMarkBytes {
				env = append(env, e)
			}
		}
		p.Spec.Containers[i].Env = slices.Clip(env)
	}
	p.Manifest = staticManifest(data)
	if p.ManifestBytes = len(p.Manifest); p.ManifestBytes > MaxManifestBytes {
		p.Manifest = ""
	}
	return nil
}

// keptMarks is the marks of in whose key keep takes and whose value is within maxMarkBytes; nil when none is.
func keptMarks(in map[string]string, keep func(string) bool) map[string]string {
	var out map[string]string
	for k, v := range in {
		if keep(k) && len(v) <= maxMarkBytes {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// boundedReader fails a read past the bound its reader allows: a JSON decoder reading from it holds at most that
// many bytes of the value it decodes.
type boundedReader struct {
	r           io.Reader
	read, limit int64
}

// errObjectTooLarge is a pod or an event larger than MaxPodBytes.
var errObjectTooLarge = fmt.Errorf("an object larger than %d bytes: no API server sends one", MaxPodBytes)

// allow lets n more bytes be read from here.
func (b *boundedReader) allow(n int64) { b.limit = b.read + n }

func (b *boundedReader) Read(p []byte) (int, error) {
	if b.read >= b.limit {
		return 0, errObjectTooLarge
	}
	if int64(len(p)) > b.limit-b.read {
		p = p[:b.limit-b.read]
	}
	n, err := b.r.Read(p)
	b.read += int64(n)
	return n, err
}

// Event is one watch event: ADDED, MODIFIED or DELETED with its pod.
type Event struct {
	Type string
	Pod  Pod
}

// Selector narrows a list or watch, as the API's fieldSelector and labelSelector parameters.
type Selector struct {
	Fields, Labels string
}

// PodClient lists and watches pods of all namespaces over the API's REST interface (API server or KubeEdge's
// MetaServer).
type PodClient struct {
	base          string
	authenticated bool
	http          *http.Client // for lists: bounded in time
	watch         *http.Client // for watches: no overall timeout
	token         string
	// tokenFile, when set, is read for every request: a projected service-account token is rotated in place,
	// and a token read once would be refused within the hour.
	tokenFile string
}

// RefusedError is the API server's 401 or 403: it was reached, and it refused.
type RefusedError struct {
	Status string
	Body   string
}

func (e *RefusedError) Error() string {
	return "refused by the API server: " + e.Status + ": " + e.Body
}

// connectTimeout bounds each step of a request's way to the server's answer: the connection, the TLS handshake,
// the answer's headers.
var connectTimeout = 10 * time.Second

// NewPodClient returns a client of the API at server (https://host:port or http://host:port); tlsConfig and
// token may be nil and empty.
func NewPodClient(server string, tlsConfig *tls.Config, token string) *PodClient {
	// A watch has no deadline of its own: without these, one begun as the link is cut waits on its connection for
	// minutes (TCP's retries), told neither reachable nor not, and is not made again until they end.
	transport := &http.Transport{TLSClientConfig: tlsConfig, IdleConnTimeout: 90 * time.Second,
		DialContext:         (&net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout: connectTimeout, ResponseHeaderTimeout: connectTimeout}
	return &PodClient{base: strings.TrimSuffix(server, "/"), token: token,
		authenticated: strings.HasPrefix(server, "https://") && (tlsConfig == nil || !tlsConfig.InsecureSkipVerify),
		http:          &http.Client{Transport: transport, Timeout: 10 * time.Second}, watch: &http.Client{Transport: transport}}
}

// Authenticated tells whether the server's answers are its own: HTTPS with its certificate checked. Over plain
// HTTP, any process of the node that binds the port while the server is down answers in its place.
func (c *PodClient) Authenticated() bool { return c.authenticated }

// URL is the server's base URL.
func (c *PodClient) URL() string { return c.base }

// WithTokenFile makes the client read its bearer token from path at every request (a projected
// service-account token, which the kubelet or edged rotates in place).
func (c *PodClient) WithTokenFile(path string) *PodClient {
	c.tokenFile = path
	return c
}

// List calls each with every pod sel selects, one at a time, and returns the list's resource version: the list
// is decoded as it arrives, never held whole, and each pod is bounded by MaxPodBytes.
func (c *PodClient) List(ctx context.Context, sel Selector, each func(*Pod)) (string, error) {
	resp, err := c.get(ctx, c.http, sel, url.Values{})
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	resourceVersion, err := decodePodList(resp.Body, each)
	if err != nil {
		return "", fmt.Errorf("decoding the pod list: %w", err)
	}
	return resourceVersion, nil
}

// decodePodList reads a PodList from r, calling each with every item as it is decoded.
func decodePodList(r io.Reader, each func(*Pod)) (string, error) {
	body := &boundedReader{r: r}
	body.allow(MaxPodBytes)
	dec := json.NewDecoder(body)
	if err := expectDelim(dec, '{'); err != nil {
		return "", err
	}
	var resourceVersion string
	for dec.More() {
		body.allow(MaxPodBytes)
		key, err := dec.Token()
		if err != nil {
			return "", err
		}
		switch key {
		case "metadata":
			var meta struct {
				ResourceVersion string `json:"resourceVersion"`
			}
			if err := dec.Decode(&meta); err != nil {
				return "", fmt.Errorf("the list's metadata: %w", err)
			}
			resourceVersion = meta.ResourceVersion
		case "items":
			if err := decodeItems(dec, body, each); err != nil {
				return "", err
			}
		default:
			var skipped json.RawMessage
			if err := dec.Decode(&skipped); err != nil {
				return "", err
			}
		}
	}
	return resourceVersion, nil
}

// decodeItems reads a list's items (an array, or null), each within MaxPodBytes.
func decodeItems(dec *json.Decoder, body *boundedReader, each func(*Pod)) error {
	tok, err := dec.Token()
	if err != nil || tok == nil {
		return err
	}
	if tok != json.Delim('[') {
		return fmt.Errorf("the list's items are %v, not an array", tok)
	}
	for dec.More() {
		body.allow(MaxPodBytes)
		var p Pod
		if err := dec.Decode(&p); err != nil {
			return fmt.Errorf("a listed pod: %w", err)
		}
		each(&p)
	}
	_, err = dec.Token() // ]
	return err
}

func expectDelim(dec *json.Decoder, want json.Delim) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if tok != want {
		return fmt.Errorf("got %v, want %v", tok, want)
	}
	return nil
}

// Watch watches the pods sel selects from resourceVersion; the channel closes when the watch ends (the server
// closed it, the link broke, an ERROR event came, or ctx ended): the caller lists again.
func (c *PodClient) Watch(ctx context.Context, sel Selector, resourceVersion string) (<-chan Event, error) {
	resp, err := c.get(ctx, c.watch, sel, url.Values{"watch": {"true"}, "resourceVersion": {resourceVersion},
		"allowWatchBookmarks": {"false"}, "timeoutSeconds": {"300"}})
	if err != nil {
		return nil, err
	}
	events := make(chan Event)
	go func() {
		defer close(events)
		defer resp.Body.Close()
		body := &boundedReader{r: bufio.NewReader(resp.Body)}
		dec := json.NewDecoder(body)
		for {
			body.allow(MaxPodBytes)
			var raw struct {
				Type   string          `json:"type"`
				Object json.RawMessage `json:"object"`
			}
			if err := dec.Decode(&raw); err != nil {
				return
			}
			if raw.Type != "ADDED" && raw.Type != "MODIFIED" && raw.Type != "DELETED" {
				return // ERROR (e.g. 410 Gone: the version is too old) or unknown: list again
			}
			ev := Event{Type: raw.Type}
			if err := json.Unmarshal(raw.Object, &ev.Pod); err != nil {
				return
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	return events, nil
}

func (c *PodClient) get(ctx context.Context, client *http.Client, sel Selector, q url.Values) (*http.Response, error) {
	if sel.Fields != "" {
		q.Set("fieldSelector", sel.Fields)
	}
	if sel.Labels != "" {
		q.Set("labelSelector", sel.Labels)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/api/v1/pods?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "lifeline-agent")
	token := c.token
	if c.tokenFile != "" {
		data, err := os.ReadFile(c.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("reading the token file %s: %w", c.tokenFile, err)
		}
		token = strings.TrimSpace(string(data))
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		resp.Body.Close()
		if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
			return nil, fmt.Errorf("GET %s: %w", req.URL.Path, &RefusedError{Status: resp.Status, Body: strings.TrimSpace(string(body))})
		}
		return nil, fmt.Errorf("GET %s: %s: %s", req.URL.Path, resp.Status, strings.TrimSpace(string(body)))
	}
	return resp, nil
}
