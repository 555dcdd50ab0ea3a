// Package promreg registers Prometheus collectors that may replace those of an earlier instance in the same
// process: a controller manager restarted in one process (a lost leadership, a test) makes its collectors anew.
package promreg

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers each collector with reg; one already registered under the same descriptions is replaced, so
// the newest instance is the one scraped.
func Register(reg prometheus.Registerer, collectors ...prometheus.Collector) error {
	for _, c := range collectors {
		err := reg.Register(c)
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			reg.Unregister(already.ExistingCollector)
			err = reg.Register(c)
		}
		if err != nil {
			return fmt.Errorf("registering metrics: %w", err)
		}
	}
	return nil
}
