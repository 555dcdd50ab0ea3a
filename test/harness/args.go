package harness

import (
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"
)

func etcdArgs(dir, clientURL string, peerPort int) []string {
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peerPort)
	return []string{
		"--name=default",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=default=" + peerURL,
		// A test cluster's data is thrown away: skipping fsync keeps etcd off the critical path of every write.
		"--unsafe-no-fsync=true",
		"--log-level=warn",
	}
}

func apiserverArgs(p *pki, etcdURL string, port int, advertise net.IP) []string {
	bind, advertised, reconciler := "127.0.0.1", "127.0.0.1", "none"
	if advertise != nil {
		// Real nodes reach it through the `kubernetes` Service, whose endpoint the lease reconciler keeps.
		bind, advertised, reconciler = "0.0.0.0", advertise.String(), "lease"
	}
	return []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + bind,
		"--advertise-address=" + advertised,
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p.servingCert,
		"--tls-private-key-file=" + p.servingKey,
		"--client-ca-file=" + p.caCert,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + p.saPublicKey,
		"--service-account-signing-key-file=" + p.saPrivateKey,
		"--service-cluster-ip-range=" + serviceCIDR,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		// Nodes are known by address, not by a name in DNS (logs, exec).
		"--kubelet-preferred-address-types=InternalIP,Hostname",
		// Without an advertise address it is loopback, which an EndpointSlice may not hold, and nothing reaches
		// the API server through the `kubernetes` Service.
		"--endpoint-reconciler-type=" + reconciler,
		"--v=1",
	}
}

func controllerManagerArgs(p *pki, kubeconfig string, port int, opts ControlPlaneOptions) []string {
	monitorPeriod := opts.NodeMonitorPeriod
	if monitorPeriod == 0 {
		monitorPeriod = time.Second
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(p.dir, "kube-controller-manager"),
		"--leader-elect=false",
		// Each controller acts with its own service account, as in kubeadm clusters, so RBAC is exercised.
		"--use-service-account-credentials=true",
		"--service-account-private-key-file=" + p.saPrivateKey,
		"--root-ca-file=" + p.caCert,
		"--cluster-signing-cert-file=" + p.caCert,
		"--cluster-signing-key-file=" + p.caKey,
		"--node-monitor-period=" + monitorPeriod.String(),
		"--v=1",
	}
	if opts.NodeMonitorGracePeriod > 0 {
		args = append(args, "--node-monitor-grace-period="+opts.NodeMonitorGracePeriod.String())
	}
	return args
}

func schedulerArgs(kubeconfig string, port int) []string {
	return []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--leader-elect=false",
		"--v=1",
	}
}
