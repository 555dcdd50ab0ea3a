package desired

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// kubeconfig is the part of a kubeconfig file the agent understands: the current context's server, its CA, and
// a client certificate or a token.
type kubeconfig struct {
	CurrentContext string `json:"current-context"`
	Contexts       []struct {
		Name    string `json:"name"`
		Context struct {
			Cluster  string `json:"cluster"`
			AuthInfo string `json:"user"`
		} `json:"context"`
	} `json:"contexts"`
	Clusters []struct {
		Name    string `json:"name"`
		Cluster struct {
			Server                   string `json:"server"`
			CertificateAuthority     string `json:"certificate-authority"`
			CertificateAuthorityData string `json:"certificate-authority-data"`
			InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		Name string `json:"name"`
		User struct {
			ClientCertificate     string `json:"client-certificate"`
			ClientCertificateData string `json:"client-certificate-data"`
			ClientKey             string `json:"client-key"`
			ClientKeyData         string `json:"client-key-data"`
			Token                 string `json:"token"`
			TokenFile             string `json:"tokenFile"`
		} `json:"user"`
	} `json:"users"`
}

// PodClientFromKubeconfig builds a pod client from a kubeconfig file's current context (file paths in it are
// relative to the file). Exec plugins and auth providers are not supported: use a certificate or a token.
func PodClientFromKubeconfig(path string) (*PodClient, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading kubeconfig: %w", err)
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return nil, fmt.Errorf("decoding kubeconfig %s: %w", path, err)
	}
	dir := filepath.Dir(path)
	var clusterName, userName string
	for _, c := range kc.Contexts {
		if c.Name == kc.CurrentContext {
			clusterName, userName = c.Context.Cluster, c.Context.AuthInfo
		}
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	server := ""
	for _, c := range kc.Clusters {
		if c.Name != clusterName {
			continue
		}
		server = c.Cluster.Server
		tlsConfig.InsecureSkipVerify = c.Cluster.InsecureSkipTLSVerify
		ca, err := inlineOrFile(c.Cluster.CertificateAuthorityData, c.Cluster.CertificateAuthority, dir)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: certificate authority: %w", path, err)
		}
		if ca != nil {
			tlsConfig.RootCAs = x509.NewCertPool()
			if !tlsConfig.RootCAs.AppendCertsFromPEM(ca) {
				return nil, fmt.Errorf("kubeconfig %s: no certificate in the certificate authority", path)
			}
		}
	}
	if server == "" {
		return nil, fmt.Errorf("kubeconfig %s: no server for the current context %q", path, kc.CurrentContext)
	}
	token, tokenFile := "", ""
	for _, u := range kc.Users {
		if u.Name != userName {
			continue
		}
		cert, err := inlineOrFile(u.User.ClientCertificateData, u.User.ClientCertificate, dir)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: client certificate: %w", path, err)
		}
		key, err := inlineOrFile(u.User.ClientKeyData, u.User.ClientKey, dir)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: client key: %w", path, err)
		}
		if cert != nil && key != nil {
			pair, err := tls.X509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("kubeconfig %s: client certificate: %w", path, err)
			}
			tlsConfig.Certificates = []tls.Certificate{pair}
		}
		token = u.User.Token
		if u.User.TokenFile != "" {
			tokenFile = resolve(u.User.TokenFile, dir)
			if _, err := os.Stat(tokenFile); err != nil {
				return nil, fmt.Errorf("kubeconfig %s: token file: %w", path, err)
			}
		}
	}
	client := NewPodClient(server, tlsConfig, token)
	client.tokenFile = tokenFile
	return client, nil
}

// inlineOrFile returns base64 data when set, else the file's content, else nil.
func inlineOrFile(data, file, dir string) ([]byte, error) {
	switch {
	case data != "":
		return base64.StdEncoding.DecodeString(data)
	case file != "":
		return os.ReadFile(resolve(file, dir))
	}
	return nil, nil
}

func resolve(path, dir string) string {
	if filepath.IsAbs(path) {
		return path
	}
	return filepath.Join(dir, path)
}

// InClusterTokenFile and InClusterCAFile are the service account's files in every pod that mounts its token, edged's
// included: its token and the API server's CA.
const (
	InClusterTokenFile = "/var/run/secrets/kubernetes.io/serviceaccount/token"
	InClusterCAFile    = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
)

// InClusterPodClient builds a pod client as any client in a pod does: the API server at the `kubernetes`
// Service's address from the environment, its certificate checked against the service account's CA, and the
// pod's token, read again at each request as the kubelet renews it. For agents on nodes whose kubelet is
// Kubernetes' own, where no MetaServer stands between them and the API server.
func InClusterPodClient() (*PodClient, error) {
	server, tlsConfig, err := InClusterServer()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(InClusterTokenFile); err != nil {
		return nil, fmt.Errorf("the service account's token: %w", err)
	}
	return NewPodClient(server, tlsConfig, "").WithTokenFile(InClusterTokenFile), nil
}

// InClusterServer is the API server's address as a pod reaches it, and the TLS configuration that checks its
// certificate against the service account's CA.
func InClusterServer() (string, *tls.Config, error) {
	host, port := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT")
	if host == "" || port == "" {
		return "", nil, fmt.Errorf("not in a pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set")
	}
	ca, err := os.ReadFile(InClusterCAFile)
	if err != nil {
		return "", nil, fmt.Errorf("reading the service account's CA (is its token mounted?): %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return "", nil, fmt.Errorf("no certificate in %s", InClusterCAFile)
	}
	return "https://" + net.JoinHostPort(host, port), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, nil
}
