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
	"strings"
	"time"
)

// Pod is what the agent reads of a pod: its identity, marks and node. Decoding only this, with the standard
// library, keeps the agent free of Kubernetes' client libraries (and small).
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
	// Raw is the pod as it was received, for a static-pod manifest of it.
	Raw json.RawMessage `json:"-"`
}

// UnmarshalJSON decodes the fields above and keeps the whole object in Raw.
func (p *Pod) UnmarshalJSON(data []byte) error {
	type fields Pod // without this method
	if err := json.Unmarshal(data, (*fields)(p)); err != nil {
		return err
	}
	p.Raw = append(json.RawMessage(nil), data...)
	return nil
}

// PodList is a list response.
type PodList struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Items []Pod `json:"items"`
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

// List lists the pods sel selects.
func (c *PodClient) List(ctx context.Context, sel Selector) (*PodList, error) {
	resp, err := c.get(ctx, c.http, sel, url.Values{})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	list := &PodList{}
	if err := json.NewDecoder(resp.Body).Decode(list); err != nil {
		return nil, fmt.Errorf("decoding the pod list: %w", err)
	}
	return list, nil
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
		dec := json.NewDecoder(bufio.NewReader(resp.Body))
		for {
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
