// Package soak runs a seeded chaos run on the simulation: partitions of each edge node's links to the API
// server and to the broker, worker kills, lost pods, agent, controller (and so broker) restarts, node reboots,
// edits of the FL job's run policy, and FL job and worker deletions, one per cycle, with the system's promises
// checked after every cycle. A failing seed replays the same run: SOAK_SEED=<seed>. SOAK_CYCLES sets the number
// of cycles (default 20; make soak runs 200).
package soak

import (
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
)

// The soak's promises as pure functions of what a check observes: the workers' pods on the API server, the
// worker processes running on every node, and the jobs as the API server has them. The run observes, these
// decide, the run counts; so every check can be shown to fail on a world that breaks its promise.

// exitRound is the fixture's exit_round: a job that succeeded with all its reports reached that round.
const exitRound = 3

// orphanGrace is how long a deleted job's workers may outlive it once every node can hear of the deletion.
const orphanGrace = 90 * time.Second

// jobLabel names the FL job a worker pod belongs to.
const jobLabel = "federatedlearningjob.sedna.io/name"

// kind is the promise a violation breaks, named as the run's summary counts it.
type kind string

const (
	duplicate  kind = "duplicates"
	orphan     kind = "orphans"
	lostReport kind = "lost-reports"
	unended    kind = "unended-jobs"
)

// violation is one broken promise: its kind and the worker identity or job it is about.
type violation struct {
	kind    kind
	subject string
}

func (v violation) String() string {
	switch v.kind {
	case duplicate:
		return v.subject + " runs twice"
	case orphan:
		return "workers of the deleted job " + v.subject + " still run or exist"
	case lostReport:
		return fmt.Sprintf("job %s succeeded without its trainers' reports of round %d", v.subject, exitRound)
	case unended:
		return "job " + v.subject + " did not end"
	}
	return string(v.kind) + " " + v.subject
}

// process is one worker process running on a node: that of a container of the pod it runs for, the worker's
// own pod (its name) or a static pod standing in for it (its name, a dash, the node's).
type process struct {
	node, pod, container string
}

// deletedJob is a deleted job's worker identities with their containers, and when it was deleted.
type deletedJob struct {
	at      time.Time
	workers map[string][]string
}

// instances counts the places one worker identity runs: its own pod on any node, or a static pod standing in
// for it, each counted once however many of its containers run.
func instances(running map[process]bool, nodes []string, name string, containers []string) int {
	n := 0
	for _, node := range nodes {
		for _, pod := range []string{name, name + "-" + node} {
			for _, c := range containers {
				if running[process{node, pod, c}] {
					n++
					break
				}
			}
		}
	}
	return n
}

// duplicates returns the identities (by name, with their containers) running more than once now, and a
// violation for each that also ran more than once at the previous check (prev) and is not counted yet: a
// static pod handed back may overlap its pod for the moment it takes to stop, so one check alone is no
// duplicate.
func duplicates(identities map[string][]string, running map[process]bool, nodes []string, prev, counted map[string]bool) (twice map[string]bool, vs []violation) {
	twice = map[string]bool{}
	for _, name := range sortedKeys(identities) {
		if instances(running, nodes, name, identities[name]) < 2 {
			continue
		}
		twice[name] = true
		if prev[name] && !counted[name] {
			vs = append(vs, violation{duplicate, name})
		}
	}
	return twice, vs
}

// orphans sorts the deleted jobs into those gone (no worker process runs, no pod of theirs is left on the API
// server) and those orphaned: still there past orphanGrace while every node can hear of the deletion
// (settled), or at all once the run has settled for good (final). The rest may still be on their way out.
func orphans(deleted map[string]deletedJob, pods []corev1.Pod, running map[process]bool, nodes []string, now time.Time, settled, final bool) (gone []string, vs []violation) {
	left := map[string]bool{}
	for _, p := range pods {
		left[p.Labels[jobLabel]] = true
	}
	for _, name := range sortedKeys(deleted) {
		d := deleted[name]
		there := left[name]
		for w, cs := range d.workers {
			if instances(running, nodes, w, cs) > 0 {
				there = true
			}
		}
		switch {
		case !there:
			gone = append(gone, name)
		case (settled && now.Sub(d.at) > orphanGrace) || final:
			vs = append(vs, violation{orphan, name})
		}
	}
	return gone, vs
}

// ended tells whether a job reached its end: succeeded, or failed.
func ended(j *v1alpha1.FederatedLearningJob) bool {
	return j.Status.Phase == v1alpha1.FLJobSucceeded || meta.IsStatusConditionTrue(j.Status.Conditions, v1alpha1.FLConditionFailed)
}

// lostReports returns a violation for each job that succeeded without its trainers' reports of the last
// round in its progress.
func lostReports(jobs ...*v1alpha1.FederatedLearningJob) []violation {
	var vs []violation
	for _, j := range jobs {
		if j.Status.Phase == v1alpha1.FLJobSucceeded && (j.Status.Progress == nil || j.Status.Progress.Round != exitRound) {
			vs = append(vs, violation{lostReport, j.Name})
		}
	}
	return vs
}

// unendedJobs returns a violation for each job, as last seen once the run gave every job its time to end,
// that did not end.
func unendedJobs(jobs ...*v1alpha1.FederatedLearningJob) []violation {
	var vs []violation
	for _, j := range jobs {
		if !ended(j) {
			vs = append(vs, violation{unended, j.Name})
		}
	}
	return vs
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
