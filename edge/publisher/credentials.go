package publisher

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"

	"github.com/go-logr/logr"

	"github.com/lifeline-edge/lifeline/internal/certfile"
)

// PasswordEnv is the environment variable the MQTT password is read from when no file names it.
const PasswordEnv = "LIFELINE_MQTT_PASSWORD"

// Password is the MQTT password: the first line of file when one is named (a mounted Secret, which the agent
// reads again at each start), else $LIFELINE_MQTT_PASSWORD; empty for a node that logs in by certificate.
func Password(file string) (string, error) {
	if file == "" {
		return os.Getenv(PasswordEnv), nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("reading the MQTT password: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}

// TLSConfig is the TLS configuration of ssl:// brokers: the broker's CA from caFile (else the system's), and the
// node's client certificate when certFile and keyFile name one. The certificate is read again at every
// connection, as the files are then: edgecore rotates them in place; until they exist the node logs in by
// password.
func TLSConfig(caFile, certFile, keyFile string, log logr.Logger) (*tls.Config, error) {
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		pool := x509.NewCertPool()
		if err != nil || !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("reading the broker's CA certificates from %s: %v", caFile, err)
		}
		config.RootCAs = pool
	}
	if certFile != "" && keyFile != "" {
		pair := &certfile.Pair{CertFile: certFile, KeyFile: keyFile}
		if err := pair.Load(); err != nil {
			return nil, fmt.Errorf("loading the client certificate %s (key %s): %w", certFile, keyFile, err)
		}
		config.GetClientCertificate = pair.GetClientCertificate
		config.ClientSessionCache = pair.SessionCache()
		if c := pair.Current(); c != nil {
			log.Info("client certificate", "subject", c.Leaf.Subject.String(), "serial", c.Leaf.SerialNumber.Text(16), "notAfter", c.Leaf.NotAfter)
		} else {
			log.Info("no client certificate yet: logging in by password until one appears", "certFile", certFile)
		}
	}
	return config, nil
}
