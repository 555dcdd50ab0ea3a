package lifelinev1

import (
	"fmt"
	"strings"
)

// Root is the first two levels of every topic: the protocol and its version.
const Root = "lifeline/v1"

// Kind is the closed set of message kinds; each has its own topic and payload type.
type Kind int

// Message kinds, one per topic leaf [P-TOPIC-1].
const (
	KindUnknown Kind = iota
	KindBirth
	KindDeath
	KindHeartbeat
	KindWorkerState
	KindReport
	KindCommand
	KindResult
	KindDataset
	KindDesired
)

var kindLeaf = map[Kind]string{
	KindBirth: "birth", KindDeath: "death", KindHeartbeat: "heartbeat", KindWorkerState: "workers",
	KindReport: "reports", KindCommand: "commands", KindResult: "results", KindDataset: "datasets",
	KindDesired: "desired",
}

func (k Kind) String() string {
	if s, ok := kindLeaf[k]; ok {
		return s
	}
	return "unknown"
}

// Topic is a parsed topic: who it is about and what it carries. Everything past the point where a message
// arrives works on this value, never on the string [P-TOPIC-2].
type Topic struct {
	Cluster string
	Node    string
	Kind    Kind
	// Namespace and Pod name the worker of a KindWorkerState topic.
	Namespace, Pod string
}

// String renders the topic: lifeline/v1/<cluster>/nodes/<node>/<leaf>[/<namespace>/<pod>].
func (t Topic) String() string {
	s := Root + "/" + t.Cluster + "/nodes/" + t.Node + "/" + t.Kind.String()
	if t.Kind == KindWorkerState {
		s += "/" + t.Namespace + "/" + t.Pod
	}
	return s
}

// NodeTopic is the topic of kind k for a node.
func NodeTopic(cluster, node string, k Kind) Topic {
	return Topic{Cluster: cluster, Node: node, Kind: k}
}

// WorkerTopic is the retained state topic of one worker.
func WorkerTopic(cluster, node, namespace, pod string) Topic {
	return Topic{Cluster: cluster, Node: node, Kind: KindWorkerState, Namespace: namespace, Pod: pod}
}

// ControllerFilter is the subscription that reads every node of a cluster.
func ControllerFilter(cluster string) string { return Root + "/" + cluster + "/nodes/+/#" }

// AgentCommandTopic is the topic of the controller's commands to a node's agent.
func AgentCommandTopic(cluster, node string) string {
	return NodeTopic(cluster, node, KindCommand).String()
}

// AgentDesiredTopic is the topic of the controller's DesiredWorkers sets for a node's agent.
func AgentDesiredTopic(cluster, node string) string {
	return NodeTopic(cluster, node, KindDesired).String()
}

// FromController tells whether only the controller publishes messages of kind k, which agents subscribe to
// [P-AUTH-1] [P-AUTH-2].
func FromController(k Kind) bool { return k == KindCommand || k == KindDesired }

// ParseTopic parses and validates a topic; names must be DNS-1123 (node, cluster, namespace: labels or
// subdomains as Kubernetes requires), so a forged topic cannot smuggle wildcards or path tricks [P-TOPIC-3].
func ParseTopic(s string) (Topic, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 6 || parts[0]+"/"+parts[1] != Root || parts[3] != "nodes" {
		return Topic{}, fmt.Errorf("topic %q is not under %s/<cluster>/nodes/", s, Root)
	}
	t := Topic{Cluster: parts[2], Node: parts[4]}
	if err := CheckDNSLabel(t.Cluster); err != nil {
		return Topic{}, fmt.Errorf("topic %q: cluster: %w", s, err)
	}
	if err := CheckDNSSubdomain(t.Node); err != nil {
		return Topic{}, fmt.Errorf("topic %q: node: %w", s, err)
	}
	for k, leaf := range kindLeaf {
		if parts[5] == leaf {
			t.Kind = k
		}
	}
	switch {
	case t.Kind == KindUnknown:
		return Topic{}, fmt.Errorf("topic %q: unknown message kind %q", s, parts[5])
	case t.Kind == KindWorkerState:
		if len(parts) != 8 {
			return Topic{}, fmt.Errorf("topic %q: a worker state topic ends in /<namespace>/<pod>", s)
		}
		t.Namespace, t.Pod = parts[6], parts[7]
		if err := CheckDNSLabel(t.Namespace); err != nil {
			return Topic{}, fmt.Errorf("topic %q: namespace: %w", s, err)
		}
		if err := CheckDNSSubdomain(t.Pod); err != nil {
			return Topic{}, fmt.Errorf("topic %q: pod: %w", s, err)
		}
	case len(parts) != 6:
		return Topic{}, fmt.Errorf("topic %q: %s topics have no further levels", s, t.Kind)
	}
	return t, nil
}
