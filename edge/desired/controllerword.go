package desired

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
)

// ControllerWord is the pod source of the controller's DesiredWorkers sets, which reach the agent over its broker
// session [P-DES-1]: each set lists the node's workers, with each one's pod as a static-pod manifest. It is
// reachable while the session is up and has the controller's set; it never lists a pod of another node, nor one
// the controller did not send in the current session.
type ControllerWord struct {
	// Node is this node: a set for another node is refused.
	Node string
	// Session tells the birth sequence of the agent's broker session and whether it is up.
	Session func() (birthSeq uint64, up bool)
	// Poll is how often a watch looks at the session (default 1 s): a watch ends when the session does.
	Poll time.Duration
	// OverTLS says the session is TLS with the broker's certificate checked: no process of the node can answer
	// in the broker's place.
	OverTLS bool

	mu    sync.Mutex
	set   *heldSet
	newer chan struct{} // closed when a newer set is taken
}

// RefusedSetError is a set the agent refused, and why [P-DES-2].
type RefusedSetError struct {
	// Reason is one of too-large, decode, forged, replayed: the refused-sets metric's label.
	Reason string
	Err    error
}

func (e *RefusedSetError) Error() string {
	return "refused the controller's set (" + e.Reason + "): " + e.Err.Error()
}

func (e *RefusedSetError) Unwrap() error { return e.Err }

// RefusedSetReasons are the values of RefusedSetError.Reason.
var RefusedSetReasons = []string{"too-large", "decode", "forged", "replayed"}

// heldSet is the latest set taken, as pods.
type heldSet struct {
	birthSeq, revision uint64
	pods               []*Pod
}

// errNoWord is a list before the current session's set arrived.
var errNoWord = errors.New("the controller's desired workers for this session have not arrived")

// Offer takes a DesiredWorkers payload that arrived in the session of birthSeq, or says why not [P-DES-2]: a
// payload beyond the bound or that does not decode, a set of another node's or another session's, or one no newer
// than the last taken: a *RefusedSetError.
func (c *ControllerWord) Offer(birthSeq uint64, payload []byte) error {
	if len(payload) > lifelinev1.MaxDesiredPayloadBytes {
		return refuse("too-large", fmt.Errorf("a set of %d bytes, beyond %d", len(payload), lifelinev1.MaxDesiredPayloadBytes))
	}
	var set lifelinev1.DesiredWorkers
	if err := proto.Unmarshal(payload, &set); err != nil {
		return refuse("decode", fmt.Errorf("decoding a set: %w", err))
	}
	if set.Node != c.Node {
		return refuse("forged", fmt.Errorf("a set for node %q", set.Node))
	}
	if set.BirthSeq != birthSeq {
		return refuse("replayed", fmt.Errorf("a set of session %d in session %d", set.BirthSeq, birthSeq))
	}
	pods, err := podsOf(c.Node, &set)
	if err != nil {
		return refuse("decode", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.set != nil && c.set.birthSeq == set.BirthSeq && set.Revision <= c.set.revision {
		return refuse("replayed", fmt.Errorf("revision %d after %d", set.Revision, c.set.revision))
	}
	c.set = &heldSet{birthSeq: set.BirthSeq, revision: set.Revision, pods: pods}
	if c.newer != nil {
		close(c.newer)
		c.newer = nil
	}
	return nil
}

// podsOf reads a set's workers as pods of node, each through the same decoder and bounds as an API server's pod.
func podsOf(node string, set *lifelinev1.DesiredWorkers) ([]*Pod, error) {
	if len(set.Workers) > MaxWorkers {
		return nil, fmt.Errorf("a set of %d workers, beyond %d", len(set.Workers), MaxWorkers)
	}
	pods := make([]*Pod, 0, len(set.Workers))
	for _, w := range set.Workers {
		var p Pod
		if err := p.UnmarshalJSON(w.Manifest); err != nil {
			return nil, fmt.Errorf("decoding the manifest of pod %s: %w", w.PodUid, err)
		}
		p.Metadata.UID, p.Spec.NodeName = w.PodUid, node
		if w.Started {
			p.Status.Phase = "Running"
		}
		if w.ManifestBytes > 0 { // the controller left the manifest out: its marks only
			p.Manifest, p.ManifestBytes = "", int(w.ManifestBytes)
		}
		pods = append(pods, &p)
	}
	return pods, nil
}

func refuse(reason string, err error) error { return &RefusedSetError{Reason: reason, Err: err} }

// current is the set of the session that is up now, nil when there is none.
func (c *ControllerWord) current() (*heldSet, chan struct{}) {
	birthSeq, up := c.Session()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !up || c.set == nil || c.set.birthSeq != birthSeq {
		return nil, nil
	}
	if c.newer == nil {
		c.newer = make(chan struct{})
	}
	return c.set, c.newer
}

// List calls each with every worker of the current session's set (whatever sel says: a set is the node's
// workers), and returns the set's revision.
func (c *ControllerWord) List(_ context.Context, _ Selector, each func(*Pod)) (string, error) {
	set, _ := c.current()
	if set == nil {
		return "", errNoWord
	}
	for _, p := range set.pods {
		each(p)
	}
	return strconv.FormatUint(set.revision, 10), nil
}

// Watch delivers no event: it ends when a set newer than resourceVersion is taken (the watcher lists it, and the
// list's word stands), when the session ends, or with ctx.
func (c *ControllerWord) Watch(ctx context.Context, _ Selector, resourceVersion string) (<-chan Event, error) {
	set, newer := c.current()
	if set == nil || strconv.FormatUint(set.revision, 10) != resourceVersion {
		return nil, errNoWord
	}
	poll := c.Poll
	if poll <= 0 {
		poll = time.Second
	}
	events := make(chan Event)
	go func() {
		defer close(events)
		tick := time.NewTicker(poll)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-newer:
				return
			case <-tick.C:
				if now, _ := c.current(); now != set {
					return
				}
			}
		}
	}()
	return events, nil
}

// URL names the source in the logs and the readiness probe.
func (c *ControllerWord) URL() string {
	return "the controller's desired workers, over the broker session"
}

// Authenticated tells whether the session is TLS with the broker's certificate checked.
func (c *ControllerWord) Authenticated() bool { return c.OverTLS }
