// Package standby keeps the node's agent one at a time and stands by for it: the node lock that the agent pod,
// an updated agent pod and the standby take in turn, and the standby itself, the agent as a static pod that acts
// only while the node is cut off and no agent pod holds it, with the files the agent pod leaves it on the node's
// disk. It exists because a kubelet that boots cut off runs no DaemonSet pod, only static pods, and the node's state
// (the journal, the stand-ins, the report port) must be one agent's at a time.
package standby

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/edge/cloudlink"
	"github.com/lifeline-edge/lifeline/edge/desired"
	"github.com/lifeline-edge/lifeline/edge/standin"
	"github.com/lifeline-edge/lifeline/edge/statefile"
)

// A kubelet that boots while its node is cut off knows none of the pods the API server gave it, the agent's
// DaemonSet pod among them: it runs only its static pods. The standby is the agent as a static pod of the node,
// installed by the agent pod, which acts only while no agent pod holds the node and the node is cut off. It then
// rebuilds the node's workers from the desired workers on the node's disk, and gives way as soon as an agent pod
// asks: the kubelet runs one once its link returns.

// Runner is the standby: it acts for the agent pod while the node is cut off and no agent pod holds the node.
type Runner struct {
	Lock NodeLock
	// CutOff tells whether the node is known to be cut off from the API server now. A node that reaches it
	// runs the agent pod soon, and its kubelet the workers' own pods: the standby waits for them.
	CutOff func() bool
	// Interval is how often the standby looks.
	Interval time.Duration
	Log      logr.Logger
}

// Run calls act while the standby holds the node, and ends act (waiting for it to return) as soon as an agent
// pod asks for the node, until ctx ends.
func (s *Runner) Run(ctx context.Context, act func(ctx context.Context)) {
	tick := time.NewTicker(s.Interval)
	defer tick.Stop()
	for {
		if s.CutOff() {
			release, ok, err := s.Lock.TryUnasked()
			if err != nil {
				s.Log.Error(err, "the standby cannot take the node")
			}
			if ok {
				asked := s.actUntilAsked(ctx, act)
				release()
				if !asked {
					// act failed by itself (its log says why): again later, not at every look.
					select {
					case <-ctx.Done():
					case <-time.After(standbyRetry):
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// standbyRetry is how long the standby waits before acting again after acting failed.
const standbyRetry = 10 * time.Second

// actUntilAsked runs act until an agent pod waits for the node (then it returns true), ctx ends or act returns.
func (s *Runner) actUntilAsked(ctx context.Context, act func(ctx context.Context)) (asked bool) {
	s.Log.Info("the node is cut off and no agent pod runs: the standby acts")
	actCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { act(actCtx); close(done) }()
	tick := time.NewTicker(s.Interval)
	defer tick.Stop()
	for {
		select {
		case <-done:
			cancel()
			return false
		case <-tick.C:
			if s.Lock.PodWaiting() {
				s.Log.Info("an agent pod runs on the node: the standby gives way")
				cancel()
				<-done
				return true
			}
		}
	}
}

// Files is what the standby needs from the cloud, which a static pod cannot mount: the agent pod leaves
// it on the node's disk, under the agent's state directory.
type Files struct {
	// Dir is the state directory's standby/.
	Dir string
}

// The files in a Files.Dir.
const (
	standbyBrokerCA  = "broker-ca.crt"
	standbyAPICA     = "api-ca.crt"
	standbyAPIServer = "api-server"
)

// FilesIn is where, in the agent's state directory, the agent pod leaves the standby's files.
func FilesIn(stateDir string) Files {
	return Files{Dir: filepath.Join(stateDir, "standby")}
}

// BrokerCA is the broker's CA as the standby reads it.
func (f Files) BrokerCA() string { return filepath.Join(f.Dir, standbyBrokerCA) }

// Leave writes the broker's CA (from brokerCAFile; empty: none), and the API server's address and CA as this pod
// reaches it, for the standby's probe.
func (f Files) Leave(brokerCAFile string) error {
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", f.Dir, err)
	}
	if brokerCAFile != "" {
		if err := copyFile(brokerCAFile, f.BrokerCA()); err != nil {
			return err
		}
	}
	server, _, err := desired.InClusterServer()
	if err != nil {
		return fmt.Errorf("the API server's address for the standby: %w", err)
	}
	if err := writeIfChanged(filepath.Join(f.Dir, standbyAPIServer), []byte(server+"\n")); err != nil {
		return err
	}
	return copyFile(desired.InClusterCAFile, filepath.Join(f.Dir, standbyAPICA))
}

// Probe is the standby's probe of the API server: url when given, else the address the agent pod left; its
// certificate checked against caFile's CA when given (cloudlink.ProbeTLS), else the CA the agent pod left, when
// there is one, else the system's.
func (f Files) Probe(url, caFile string) (*cloudlink.Probe, error) {
	if url == "" {
		data, err := os.ReadFile(filepath.Join(f.Dir, standbyAPIServer))
		if err != nil {
			return nil, fmt.Errorf("no --cloud-probe and no API server address left by the agent pod: %w", err)
		}
		url = strings.TrimSpace(string(data)) + "/readyz"
	}
	tlsConfig, err := cloudlink.ProbeTLS(url, caFile)
	if err != nil {
		return nil, err
	}
	probe := &cloudlink.Probe{URL: url, TLS: tlsConfig}
	if pem, err := os.ReadFile(filepath.Join(f.Dir, standbyAPICA)); err == nil && caFile == "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in the API server's CA left by the agent pod, %s", filepath.Join(f.Dir, standbyAPICA))
		}
		probe.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	return probe, nil
}

// standbyManifestFile is the standby's static pod in the kubelet's manifest directory; not a stand-in (those are
// lifeline-*.json).
const standbyManifestFile = "lifeline-agent-standby.yaml"

// Install puts the standby's manifest (read from manifestFile) in staticDir, rewriting it only when it
// changed: the kubelet restarts a static pod whose manifest changes.
func Install(manifestFile, staticDir string) error {
	data, err := os.ReadFile(manifestFile)
	if err != nil {
		return fmt.Errorf("reading the standby's manifest: %w", err)
	}
	return writeIfChanged(filepath.Join(staticDir, standbyManifestFile), data)
}

// Remove takes the standby's manifest out of staticDir (the kubelet then stops it) and its files off
// the node.
func Remove(staticDir string, files Files) error {
	err := os.Remove(filepath.Join(staticDir, standbyManifestFile))
	if err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("removing the standby's manifest: %w", err)
	}
	if err := os.RemoveAll(files.Dir); err != nil {
		return fmt.Errorf("removing the standby's files: %w", err)
	}
	return nil
}

// RemoveIfUninstalled removes the node's standby and its stand-ins once the agent's DaemonSet (daemonSet,
// namespace/name) is gone: an upgrade or a restart keeps them, helm uninstall does not. ownerGone reads the
// DaemonSet (OwnerGone in a pod); when it cannot tell, everything stays.
func RemoveIfUninstalled(ctx context.Context, daemonSet, staticDir, stateDir string,
	ownerGone func(ctx context.Context, namespace, name string) (bool, error), log logr.Logger) {
	namespace, name, ok := strings.Cut(daemonSet, "/")
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	gone, err := ownerGone(ctx, namespace, name)
	if err != nil {
		log.Info("the standby stays: the DaemonSet could not be read", "reason", err.Error())
		return
	}
	if !gone {
		return
	}
	if err := Remove(staticDir, FilesIn(stateDir)); err != nil {
		log.Error(err, "removing the standby")
		return
	}
	if err := (&standin.StaticPods{Dir: staticDir, GatesDir: standin.GatesDir(stateDir)}).RemoveAll(); err != nil {
		log.Error(err, "removing the stand-ins")
		return
	}
	log.Info("the DaemonSet is gone: the node's standby and stand-ins are removed")
}

// OwnerGone tells whether the agent pod's DaemonSet namespace/name is gone (helm uninstall): the API server
// answers that it is not found, or refuses the pod's account, which the uninstall removes with it. An API
// server out of reach says nothing: the standby stays.
func OwnerGone(ctx context.Context, namespace, name string) (bool, error) {
	server, tlsConfig, err := desired.InClusterServer()
	if err != nil {
		return false, err
	}
	token, err := os.ReadFile(desired.InClusterTokenFile)
	if err != nil {
		return false, fmt.Errorf("reading the pod's token: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		fmt.Sprintf("%s/apis/apps/v1/namespaces/%s/daemonsets/%s", server, namespace, name), nil)
	if err != nil {
		return false, err
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("reading the DaemonSet %s/%s: %w", namespace, name, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		var ds struct {
			Metadata struct {
				DeletionTimestamp *string `json:"deletionTimestamp"`
			} `json:"metadata"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ds); err != nil {
			return false, fmt.Errorf("decoding the DaemonSet %s/%s: %w", namespace, name, err)
		}
		return ds.Metadata.DeletionTimestamp != nil, nil
	case http.StatusNotFound, http.StatusUnauthorized, http.StatusForbidden:
		return true, nil
	}
	return false, fmt.Errorf("reading the DaemonSet %s/%s: %s", namespace, name, resp.Status)
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return fmt.Errorf("reading %s: %w", from, err)
	}
	return writeIfChanged(to, data)
}

// writeIfChanged writes data to path atomically, unless path already holds it.
func writeIfChanged(path string, data []byte) error {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return nil
	}
	return statefile.Write(path, data)
}

// Source is the standby's pod source: none. A static pod has no credentials for the API server, and the
// standby acts only while the API server is out of reach: the node's workers are the desired workers the agent
// pod left on the node's disk.
type Source struct{}

var errStandbyReadsNoPods = errors.New("the standby reads no pods: the agent pod does")

// List refuses.
func (Source) List(context.Context, desired.Selector, func(*desired.Pod)) (string, error) {
	return "", errStandbyReadsNoPods
}

// Watch refuses.
func (Source) Watch(context.Context, desired.Selector, string) (<-chan desired.Event, error) {
	return nil, errStandbyReadsNoPods
}
