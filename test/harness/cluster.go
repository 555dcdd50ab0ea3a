package harness

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/lifeline-edge/lifeline/test/testkit"
)

// Binary names, as `make tools` writes them into bin/.
const (
	EtcdBinary              = "etcd"
	APIServerBinary         = "kube-apiserver"
	ControllerManagerBinary = "kube-controller-manager"
	SchedulerBinary         = "kube-scheduler"
	KubectlBinary           = "kubectl"
)

// BinDirEnv names the environment variable that overrides where the binaries are looked up.
const BinDirEnv = "LIFELINE_BIN_DIR"

// serviceCIDR is the Service IP range, room for the thousands of Services of a scale test; its first address is the `kubernetes` Service and must be in the
// API server's serving certificate.
const (
	serviceCIDR      = "10.0.0.0/16"
	kubernetesSvcIP  = "10.0.0.1"
	defaultStartWait = 3 * time.Minute
)

// ControlPlaneOptions configure a control plane. The zero value starts every component on free ports in a new
// temporary directory with the upstream defaults for node monitoring.
type ControlPlaneOptions struct {
	// BinDir holds the binaries. Empty means $LIFELINE_BIN_DIR, or else bin/ at the root of this repository.
	BinDir string
	// Dir is where data, certificates, kubeconfigs and logs go. Empty means a new temporary directory, which
	// Stop removes unless KeepDir is set.
	Dir string
	// KeepDir keeps Dir after Stop, so its logs can be read.
	KeepDir bool

	// Ports on 127.0.0.1; zero picks a free one.
	APIServerPort, EtcdClientPort, EtcdPeerPort, ControllerManagerPort, SchedulerPort int

	// NodeMonitorGracePeriod is how long a Node may go without renewing its lease before the node lifecycle
	// controller marks it NotReady/Unknown and taints it. Zero keeps kube-controller-manager's default.
	NodeMonitorGracePeriod time.Duration
	// NodeMonitorPeriod is how often the node lifecycle controller checks leases. Zero means one second, so
	// tests of disconnection do not wait for the upstream five.
	NodeMonitorPeriod time.Duration

	// CRDDirs are directories of CustomResourceDefinition YAML installed once the API server is ready and
	// before kube-controller-manager starts, as in a cluster where the CRDs predate the workload: the garbage
	// collector then watches their kinds from the start instead of after its next discovery resync.
	CRDDirs []string
	// Policies are YAML files whose ValidatingAdmissionPolicies and their bindings (other objects are left out:
	// the chart's deploy/manifests/lifeline.yaml) are installed after the CRDs, and waited on until the API server
	// enforces them.
	Policies []string

	// WithoutScheduler and WithoutControllerManager leave those components out.
	WithoutScheduler, WithoutControllerManager bool

	// AdvertiseAddress, when set, makes kube-apiserver listen on every address and advertise this one (also named
	// in its serving certificate) as the `kubernetes` Service's endpoint, so that pods of real nodes reach it
	// through kube-proxy. Nil keeps everything on loopback.
	AdvertiseAddress net.IP

	// APIServerArgs are more flags for kube-apiserver, after the harness's own.
	APIServerArgs []string

	// StartTimeout bounds the whole start-up. Zero means three minutes.
	StartTimeout time.Duration
	// Progress receives one line per start-up step. Nil means os.Stderr.
	Progress io.Writer
}

// ControlPlane is a running control plane. Stop it when done; it is safe to call Stop more than once.
type ControlPlane struct {
	// Dir holds data, certificates, kubeconfigs and a <component>.log per process.
	Dir string
	// Kubeconfig is the path of a kubeconfig with cluster-admin credentials (group system:masters).
	Kubeconfig string
	// Config is the admin client configuration of Kubeconfig.
	Config *rest.Config
	// APIServerURL is the https address of kube-apiserver.
	APIServerURL string
	// BinDir is where the binaries were taken from; kubectl is there too.
	BinDir string
	// StartupDuration is how long Start took until every component was ready.
	StartupDuration time.Duration

	mu               sync.Mutex
	pki              *pki
	components       []*Process
	controlPlaneSize int // the first components are the control plane's own; Healthy checks only those
	removeDir        bool
	stopOnce         sync.Once
}

// StartControlPlane launches the control plane and waits until each component is ready: etcd answers /health,
// the API server /readyz, the controller manager and scheduler /healthz, and the service-account controller has
// made the default ServiceAccount, without which no Pod can be created. On any error everything started is
// stopped.
func StartControlPlane(ctx context.Context, opts ControlPlaneOptions) (_ *ControlPlane, err error) {
	began := time.Now()
	progress := opts.Progress
	if progress == nil {
		progress = os.Stderr
	}
	step := func(format string, args ...any) {
		fmt.Fprintf(progress, "control plane: "+format+" (%.1fs)\n", append(args, time.Since(began).Seconds())...)
	}
	timeout := opts.StartTimeout
	if timeout == 0 {
		timeout = defaultStartWait
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	cp := &ControlPlane{}
	if cp.BinDir, err = resolveBinDir(opts.BinDir); err != nil {
		return nil, err
	}
	bins := map[string]string{}
	for _, name := range requiredBinaries(opts) {
		if bins[name], err = findBinary(cp.BinDir, name); err != nil {
			return nil, err
		}
	}
	ports, err := choosePorts(opts)
	if err != nil {
		return nil, err
	}

	cp.Dir = opts.Dir
	if cp.Dir == "" {
		if cp.Dir, err = os.MkdirTemp("", "lifeline-cp-"); err != nil {
			return nil, fmt.Errorf("creating control-plane dir: %w", err)
		}
		cp.removeDir = !opts.KeepDir
	}
	defer func() {
		if err != nil {
			cp.stop()
			err = fmt.Errorf("%w\n(control-plane logs: %s)", err, cp.Dir)
		}
	}()

	servingIPs := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP(kubernetesSvcIP)}
	if opts.AdvertiseAddress != nil {
		servingIPs = append(servingIPs, opts.AdvertiseAddress)
	}
	p, err := newPKI(filepath.Join(cp.Dir, "pki"), servingIPs,
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc.cluster.local"})
	if err != nil {
		return nil, err
	}
	cp.pki = p
	cp.APIServerURL = fmt.Sprintf("https://127.0.0.1:%d", ports.apiserver)

	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports.etcdClient)
	etcd, err := cp.launch(EtcdBinary, bins[EtcdBinary], etcdArgs(cp.Dir, etcdURL, ports.etcdPeer))
	if err != nil {
		return nil, err
	}
	if err := WaitUntil(ctx, etcd, "etcd /health", func() error { return etcdHealthy(ctx, etcdURL) }); err != nil {
		return nil, err
	}
	step("etcd ready on %s", etcdURL)

	apiserver, err := cp.launch(APIServerBinary, bins[APIServerBinary], append(apiserverArgs(p, etcdURL, ports.apiserver, opts.AdvertiseAddress), opts.APIServerArgs...))
	if err != nil {
		return nil, err
	}
	admin, err := p.clientCert("lifeline-admin", "system:masters")
	if err != nil {
		return nil, err
	}
	if cp.Kubeconfig, err = writeKubeconfig(cp.Dir, "admin", cp.APIServerURL, p.caCert, admin); err != nil {
		return nil, err
	}
	if cp.Config, err = clientcmd.BuildConfigFromFlags("", cp.Kubeconfig); err != nil {
		return nil, fmt.Errorf("loading admin kubeconfig: %w", err)
	}
	cp.Config.QPS, cp.Config.Burst = 200, 400
	client, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		return nil, fmt.Errorf("building admin client: %w", err)
	}
	if err := WaitUntil(ctx, apiserver, "kube-apiserver /readyz", func() error {
		_, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		return err
	}); err != nil {
		return nil, err
	}
	step("kube-apiserver ready on %s", cp.APIServerURL)
	for _, dir := range opts.CRDDirs {
		if err := InstallCRDs(ctx, cp.Config, dir); err != nil {
			return nil, err
		}
		step("CRDs of %s established", dir)
	}
	if len(opts.Policies) > 0 {
		if err := InstallPolicies(ctx, cp.Config, opts.Policies...); err != nil {
			return nil, err
		}
		step("admission policies of %s enforced", strings.Join(opts.Policies, ", "))
	}

	if !opts.WithoutControllerManager {
		kcm, err := p.clientCert("system:kube-controller-manager")
		if err != nil {
			return nil, err
		}
		kubeconfig, err := writeKubeconfig(cp.Dir, "kube-controller-manager", cp.APIServerURL, p.caCert, kcm)
		if err != nil {
			return nil, err
		}
		proc, err := cp.launch(ControllerManagerBinary, bins[ControllerManagerBinary],
			controllerManagerArgs(p, kubeconfig, ports.controllerManager, opts))
		if err != nil {
			return nil, err
		}
		if err := WaitUntil(ctx, proc, "kube-controller-manager /healthz", func() error {
			return httpsHealthy(ctx, ports.controllerManager)
		}); err != nil {
			return nil, err
		}
		if err := WaitUntil(ctx, proc, "the default ServiceAccount", func() error {
			_, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
			return err
		}); err != nil {
			return nil, err
		}
		step("kube-controller-manager ready")
	}

	if !opts.WithoutScheduler {
		sched, err := p.clientCert("system:kube-scheduler")
		if err != nil {
			return nil, err
		}
		kubeconfig, err := writeKubeconfig(cp.Dir, "kube-scheduler", cp.APIServerURL, p.caCert, sched)
		if err != nil {
			return nil, err
		}
		proc, err := cp.launch(SchedulerBinary, bins[SchedulerBinary], schedulerArgs(kubeconfig, ports.scheduler))
		if err != nil {
			return nil, err
		}
		if err := WaitUntil(ctx, proc, "kube-scheduler /healthz", func() error {
			return httpsHealthy(ctx, ports.scheduler)
		}); err != nil {
			return nil, err
		}
		step("kube-scheduler ready")
	}

	cp.controlPlaneSize = len(cp.components)
	cp.StartupDuration = time.Since(began)
	step("ready; admin kubeconfig %s", cp.Kubeconfig)
	return cp, nil
}

// Stop ends every component, newest first, and removes the directory unless it is to be kept.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(cp.stop)
}

// KeepDir makes Stop leave the directory in place, e.g. because a test failed and its logs are wanted.
func (cp *ControlPlane) KeepDir() { cp.removeDir = false }

// Healthy returns an error naming the first component that is no longer running.
func (cp *ControlPlane) Healthy() error {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for _, c := range cp.components[:min(len(cp.components), cp.controlPlaneSize)] {
		if err := c.Exited(); err != nil {
			return err
		}
	}
	return nil
}

// ClientKubeconfig writes a kubeconfig for user in groups, with a client certificate signed by the cluster's CA,
// as a cluster hands out to its nodes (user system:node:<name> in group system:nodes) and node components; server
// is the API server's address as that client reaches it. It returns the kubeconfig's path.
func (cp *ControlPlane) ClientKubeconfig(server, user string, groups ...string) (string, error) {
	cred, err := cp.pki.clientCert(user, groups...)
	if err != nil {
		return "", err
	}
	return writeKubeconfig(cp.Dir, user, server, cp.pki.caCert, cred)
}

// CAFile is the path of the cluster's CA certificate, which signed the API server's serving certificate.
func (cp *ControlPlane) CAFile() string { return cp.pki.caCert }

// ServingCert signs a server certificate for name on this machine's loopback by the control plane's CA, and returns
// its certificate and key files.
func (cp *ControlPlane) ServingCert(name string) (cert, key string, err error) {
	c, err := cp.pki.signServing(name, []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"})
	return c.cert, c.key, err
}

// Client returns a typed admin client.
func (cp *ControlPlane) Client() (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cp.Config)
}

func (cp *ControlPlane) stop() {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for i := len(cp.components) - 1; i >= 0; i-- {
		cp.components[i].Stop(10 * time.Second)
	}
	if cp.removeDir {
		_ = os.RemoveAll(cp.Dir)
	}
}

// launch starts a component in the control plane's process group.
func (cp *ControlPlane) launch(name, binary string, args []string) (*Process, error) {
	return cp.Launch(name, binary, args, nil)
}

// Launch starts another process in the control plane's process group, logging to <Dir>/<name>.log (appended,
// so a process launched again under the same name keeps its history). Stop ends it with the control plane, last
// launched first. env nil means this process's environment.
func (cp *ControlPlane) Launch(name, binary string, args, env []string) (*Process, error) {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	pgid := 0
	if len(cp.components) > 0 {
		pgid = cp.components[0].cmd.Process.Pid
	}
	c, err := startComponent(name, binary, args, env, cp.Dir, pgid)
	if err != nil {
		return nil, err
	}
	cp.components = append(cp.components, c)
	return c, nil
}

func requiredBinaries(opts ControlPlaneOptions) []string {
	names := []string{EtcdBinary, APIServerBinary}
	if !opts.WithoutControllerManager {
		names = append(names, ControllerManagerBinary)
	}
	if !opts.WithoutScheduler {
		names = append(names, SchedulerBinary)
	}
	return names
}

type portSet struct {
	apiserver, etcdClient, etcdPeer, controllerManager, scheduler int
}

// choosePorts fills in free ports and checks that the requested ones are free, so a taken port is reported by
// name before anything starts instead of as a child that dies.
func choosePorts(opts ControlPlaneOptions) (portSet, error) {
	ps := portSet{}
	wanted := []struct {
		what string
		in   int
		out  *int
	}{
		{"kube-apiserver", opts.APIServerPort, &ps.apiserver},
		{"etcd client", opts.EtcdClientPort, &ps.etcdClient},
		{"etcd peer", opts.EtcdPeerPort, &ps.etcdPeer},
		{"kube-controller-manager", opts.ControllerManagerPort, &ps.controllerManager},
		{"kube-scheduler", opts.SchedulerPort, &ps.scheduler},
	}
	// Hold every listener until all ports are chosen, so no two components get the same free port.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for _, w := range wanted {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(w.in)))
		if err != nil {
			return ps, fmt.Errorf("%s port 127.0.0.1:%d is not available: %w", w.what, w.in, err)
		}
		held = append(held, l)
		*w.out = l.Addr().(*net.TCPAddr).Port
	}
	return ps, nil
}

// resolveBinDir returns dir, or else $LIFELINE_BIN_DIR, or else bin/ at the root of this repository, so tests
// in any package find the same binaries.
func resolveBinDir(dir string) (string, error) {
	if dir == "" {
		dir = os.Getenv(BinDirEnv)
	}
	if dir != "" {
		return filepath.Abs(dir)
	}
	root, err := testkit.RepoRoot()
	if err != nil {
		return "", fmt.Errorf("%w: set %s", err, BinDirEnv)
	}
	return filepath.Join(root, "bin"), nil
}

// WaitUntil polls check until it succeeds, the process c exits, or ctx ends; the error says which, quoting the end
// of c's log on a timeout.
func WaitUntil(ctx context.Context, c *Process, what string, check func() error) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		lastErr := check()
		if lastErr == nil {
			return nil
		}
		if err := c.Exited(); err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("timed out waiting for %s (last error: %v); last lines of %s:\n%s",
				what, lastErr, c.logPath, tail(c.logPath, 15))
		case <-c.exited:
		case <-tick.C:
		}
	}
}

func etcdHealthy(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"health":"true"`) {
		return fmt.Errorf("etcd not healthy: %s %s", resp.Status, body)
	}
	return nil
}

// insecureHealthClient reads /healthz of components that serve self-signed certificates; it carries no
// credentials, and /healthz is always allowed for anonymous callers.
var insecureHealthClient = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // loopback, self-signed
}

func httpsHealthy(ctx context.Context, port int) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("https://127.0.0.1:%d/healthz", port), nil)
	if err != nil {
		return err
	}
	resp, err := insecureHealthClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("healthz: %s %s", resp.Status, body)
	}
	return nil
}

func writeKubeconfig(dir, user, server, caFile string, cred clientCredential) (string, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["lifeline"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: caFile}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificate: cred.cert, ClientKey: cred.key}
	cfg.Contexts["lifeline"] = &clientcmdapi.Context{Cluster: "lifeline", AuthInfo: user}
	cfg.CurrentContext = "lifeline"
	path := filepath.Join(dir, user+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("writing kubeconfig %s: %w", path, err)
	}
	return path, nil
}
