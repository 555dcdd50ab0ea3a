// Package federatedlearning reconciles FederatedLearningJobs into an aggregator pod behind a Service and one
// trainer pod per training worker, with stable identities and Job-like retries, completion and deadlines.
package federatedlearning

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
)

// Kind is the kind this package reconciles.
const Kind = "FederatedLearningJob"

// AggregationPort is the aggregator's port, behind the `<job>-aggregation` Service.
const AggregationPort = 7363

// Worker types as Sedna writes them in names and labels.
const (
	workerTypeAggregation = "aggregation"
	workerTypeTraining    = "train"
)

// Length limits of the names Lifeline derives from a job's name.
const (
	maxPodName     = 63 // a pod's name is also its hostname and WORKER_NAME; keep it a DNS label
	maxServiceName = 63 // a Service name is a DNS-1035 label
	maxLabelValue  = 63
)

// shorten returns base+suffix when it fits in max characters. Otherwise it cuts base and puts an 8-hex-digit
// hash of the whole base before the suffix, so two long names that share a prefix still differ, and the same
// base always gives the same name.
func shorten(base, suffix string, max int) string {
	if len(base)+len(suffix) <= max {
		return base + suffix
	}
	sum := sha256.Sum256([]byte(base))
	hash := hex.EncodeToString(sum[:4])
	keep := max - len(suffix) - len(hash) - 1
	return base[:keep] + "-" + hash + suffix
}

// AggregatorName is the aggregator pod's name and WORKER_NAME: `<job>-aggworker`.
func AggregatorName(job string) string { return shorten(job, "-aggworker", maxPodName) }

// TrainerName is the i-th trainer's pod name and WORKER_NAME: `<job>-trainworker-<i>`, i being its index in
// spec.trainingWorkers.
func TrainerName(job string, i int) string {
	return shorten(job, "-trainworker-"+strconv.Itoa(i), maxPodName)
}

// ServiceName is the aggregator's Service: `<job>-aggregation`.
func ServiceName(job string) string { return shorten(job, "-"+workerTypeAggregation, maxServiceName) }

// nameLabelValue is the job's name as a label value.
func nameLabelValue(job string) string { return shorten(job, "", maxLabelValue) }
