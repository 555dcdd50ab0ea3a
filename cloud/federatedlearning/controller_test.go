package federatedlearning_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	lifelinev1 "github.com/lifeline-edge/lifeline/proto/lifeline/v1"
	"github.com/lifeline-edge/lifeline/test/harness"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

const within = 30 * time.Second

// The keys of the examples' credential Secret, which must never appear in a pod.
const (
	accessKey = "access-key-7f3c"
	secretKey = "secret-key-9e1d"
)

// loadJob reads the job of one of Lifeline's examples into ns and creates the Models, Datasets and Secret it
// names.
func loadJob(t testing.TB, file, ns string) *v1alpha1.FederatedLearningJob {
	t.Helper()
	set, err := testkit.Examples()
	if err != nil {
		t.Fatal(err)
	}
	return loadJobFrom(t, set, file, ns)
}

// loadJobFrom reads the job of an example file of set into ns and creates the Models, Datasets and Secret it
// names: the test's own, so their URLs and keys are known whatever the example says.
func loadJobFrom(t testing.TB, set testkit.Set, file, ns string) *v1alpha1.FederatedLearningJob {
	t.Helper()
	job := &v1alpha1.FederatedLearningJob{}
	if err := set.LoadObject(file, testkit.DefaultVars, job); err != nil {
		t.Fatal(err)
	}
	job.Namespace = ns
	ctx := context.Background()
	create := func(o client.Object) {
		if err := env.Client.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("creating %T %s: %v", o, o.GetName(), err)
		}
	}
	create(&v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: job.Spec.AggregationWorker.Model.Name},
		Spec: v1alpha1.ModelSpec{URL: "/models/fl/model.pb", Format: "pb"}})
	if pm := job.Spec.PretrainedModel; pm != nil {
		create(&v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pm.Name},
			Spec: v1alpha1.ModelSpec{URL: "/models/fl/pretrained.pb", Format: "pb"}})
	}
	for i, tw := range job.Spec.TrainingWorkers {
		create(&v1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: tw.Dataset.Name},
			Spec: v1alpha1.DatasetSpec{URL: fmt.Sprintf("/data/set%d/train.txt", i), Format: "txt", NodeName: "edge-node"}})
	}
	if t := job.Spec.Transmitter; t != nil && t.S3 != nil && t.S3.CredentialName != "" {
		create(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: t.S3.CredentialName,
			Annotations: map[string]string{contract.AnnotationS3Endpoint: "minio:9000"}},
			StringData: map[string]string{contract.EnvAccessKeyID: accessKey, contract.EnvSecretAccessKey: secretKey}})
	}
	return job
}

// startJob creates the job of one of Lifeline's examples, optionally edited, and waits for its workers to run.
func startJob(t testing.TB, file string, edit func(*v1alpha1.FederatedLearningJob)) *v1alpha1.FederatedLearningJob {
	t.Helper()
	set, err := testkit.Examples()
	if err != nil {
		t.Fatal(err)
	}
	return startJobFrom(t, set, file, edit)
}

// startJobFrom creates the job of an example file of set, optionally edited, and waits for its workers to run.
func startJobFrom(t testing.TB, set testkit.Set, file string, edit func(*v1alpha1.FederatedLearningJob)) *v1alpha1.FederatedLearningJob {
	t.Helper()
	job := loadJobFrom(t, set, file, env.NewNamespace(t, "fl"))
	if edit != nil {
		edit(job)
	}
	if err := env.Client.Create(context.Background(), job); err != nil {
		t.Fatalf("creating job: %v", err)
	}
	waitRunning(t, job, 1+len(job.Spec.TrainingWorkers))
	return job
}

// waitRunning waits until n pods of the job run, and returns every pod of its namespace by name. A pod is the job's
// when the job controls it: another job may share the namespace, or have had the job's name.
func waitRunning(t testing.TB, job *v1alpha1.FederatedLearningJob, n int) map[string]*corev1.Pod {
	t.Helper()
	var pods map[string]*corev1.Pod
	eventually(t, within, fmt.Sprintf("%d running workers", n), func(ctx context.Context) (bool, error) {
		pods = workerPods(t, job)
		running := 0
		for _, p := range pods {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && metav1.IsControlledBy(p, job) {
				running++
			}
		}
		if running != n {
			return false, fmt.Errorf("%d of %d running", running, n)
		}
		return true, nil
	})
	return pods
}

// workerPods lists the pods of a job by name.
func workerPods(t testing.TB, job *v1alpha1.FederatedLearningJob) map[string]*corev1.Pod {
	t.Helper()
	list := &corev1.PodList{}
	if err := env.Client.List(context.Background(), list, client.InNamespace(job.Namespace)); err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for i := range list.Items {
		pods[list.Items[i].Name] = &list.Items[i]
	}
	return pods
}

func getJob(t testing.TB, job *v1alpha1.FederatedLearningJob) *v1alpha1.FederatedLearningJob {
	t.Helper()
	got := &v1alpha1.FederatedLearningJob{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// waitCondition waits for condition cond to be True with the given reason.
func waitCondition(t testing.TB, job *v1alpha1.FederatedLearningJob, cond, reason string) *v1alpha1.FederatedLearningJob {
	t.Helper()
	got := &v1alpha1.FederatedLearningJob{}
	eventually(t, within, cond+"/"+reason, func(ctx context.Context) (bool, error) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), got); err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(got.Status.Conditions, cond)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason {
			return false, fmt.Errorf("conditions %+v", got.Status.Conditions)
		}
		return true, nil
	})
	return got
}

// endPod sets a running pod's phase through the status subresource, as a kubelet reports a container's end.
func endPod(t testing.TB, pod *corev1.Pod, phase corev1.PodPhase, exitCode int32, extra ...corev1.PodCondition) {
	t.Helper()
	env.Kubelet.Hold(pod.UID)
	current := &corev1.Pod{}
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(pod), current); err != nil {
		t.Fatal(err)
	}
	current.Status.Phase = phase
	current.Status.Conditions = append(current.Status.Conditions, extra...)
	for i := range current.Status.ContainerStatuses {
		current.Status.ContainerStatuses[i].State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: exitCode, Reason: map[bool]string{true: "Completed", false: "Error"}[exitCode == 0]}}
		current.Status.ContainerStatuses[i].Ready = false
	}
	if err := env.Client.Status().Update(context.Background(), current); err != nil {
		t.Fatalf("setting %s %s: %v", pod.Name, phase, err)
	}
}

func envOf(pod *corev1.Pod) map[string]string {
	m := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		m[e.Name] = e.Value
	}
	return m
}

func workerRecord(job *v1alpha1.FederatedLearningJob, name string) v1alpha1.WorkerStatus {
	for _, w := range job.Status.Workers {
		if w.Name == name {
			return w
		}
	}
	return v1alpha1.WorkerStatus{}
}

// TestExamplesCreateNamedWorkersWithTheContract runs the job of every example, Lifeline's and upstream Sedna's,
// and checks its workers' names and the contract they get.
func TestExamplesCreateNamedWorkersWithTheContract(t *testing.T) {
	harness.SkipIfShort(t)
	testkit.ForEachSet(t, func(t *testing.T, set testkit.Set) {
		files, err := set.FilesOf(fl.Kind, testkit.DefaultVars)
		if err != nil || len(files) == 0 {
			t.Fatalf("%s files with a %s: %v, %v", set.Name, fl.Kind, files, err)
		}
		testExamplesCreateNamedWorkers(t, set, files)
	})
}

func testExamplesCreateNamedWorkers(t *testing.T, set testkit.Set, files []string) {
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			job := startJobFrom(t, set, file, nil)
			pods := workerPods(t, job)
			agg := pods[fl.AggregatorName(job.Name)]
			if agg == nil {
				t.Fatalf("no aggregator %s among %v", fl.AggregatorName(job.Name), keys(pods))
			}
			aggEnv := envOf(agg)
			for k, want := range map[string]string{
				contract.EnvWorkerName: agg.Name, contract.EnvJobName: job.Name, contract.EnvNamespace: job.Namespace,
				contract.EnvAggBindPort: "7363", contract.EnvParticipantsCount: "2", contract.EnvModelURL: "/home/data/models/fl/model.pb",
			} {
				if aggEnv[k] != want {
					t.Errorf("aggregator env %s = %q, want %q", k, aggEnv[k], want)
				}
			}
			for i := range job.Spec.TrainingWorkers {
				name := fl.TrainerName(job.Name, i)
				tr := pods[name]
				if tr == nil {
					t.Fatalf("no trainer %s among %v", name, keys(pods))
				}
				e := envOf(tr)
				for k, want := range map[string]string{
					contract.EnvWorkerName: name, contract.EnvAggIP: job.Name + "-aggregation." + job.Namespace,
					contract.EnvAggPort: "7363", contract.EnvParticipantsCount: "2", contract.EnvLCServer: contract.DefaultLCServer,
					contract.EnvTrainDatasetURL: fmt.Sprintf("/home/data/data/set%d/train.txt", i),
					contract.EnvDatasetName:     job.Spec.TrainingWorkers[i].Dataset.Name,
				} {
					if e[k] != want {
						t.Errorf("%s env %s = %q, want %q", name, k, e[k], want)
					}
				}
				if !tr.Spec.HostNetwork || tr.Spec.RestartPolicy != corev1.RestartPolicyOnFailure {
					t.Errorf("%s hostNetwork=%v restartPolicy=%s", name, tr.Spec.HostNetwork, tr.Spec.RestartPolicy)
				}
				if s3 := job.Spec.Transmitter; s3 != nil && s3.S3 != nil {
					if e[contract.EnvTransmitter] != "s3" || e[contract.EnvS3EndpointURL] != "https://minio:9000" {
						t.Errorf("%s s3 transmitter env = %v", name, e)
					}
					assertKeysByReference(t, tr, s3.S3.CredentialName)
				}
				if job.Spec.PretrainedModel != nil && e[contract.EnvPretrainedModelURL] != "/home/data/models/fl/pretrained.pb" {
					t.Errorf("%s PRETRAINED_MODEL_URL = %q", name, e[contract.EnvPretrainedModelURL])
				}
			}
			for _, p := range pods {
				if !controllerutilContains(p.Finalizers, fl.WorkerFinalizer) {
					t.Errorf("%s lacks the accounting finalizer: %v", p.Name, p.Finalizers)
				}
			}
			svc := &corev1.Service{}
			if err := env.Client.Get(context.Background(), types.NamespacedName{Namespace: job.Namespace, Name: fl.ServiceName(job.Name)}, svc); err != nil {
				t.Fatal(err)
			}
			if p := svc.Spec.Ports[0]; p.Port != 7363 || p.Name != "tcp-0" {
				t.Errorf("service port %+v", p)
			}
			assertStartTold(t, job, keys(pods))
			eventually(t, within, "phase Running", func(ctx context.Context) (bool, error) {
				got := getJob(t, job)
				if got.Status.Phase != v1alpha1.FLJobRunning || got.Status.Active != 3 ||
					!meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.FLConditionTraining) {
					return false, fmt.Errorf("status %+v", got.Status)
				}
				return true, nil
			})
		})
	}
}

// assertStartTold: a job's first pass creates its Service alone and tells of it, the next creates its workers and
// tells of them in one SuccessfulCreate Event ("Created Pod a, Pod b").
func assertStartTold(t *testing.T, job *v1alpha1.FederatedLearningJob, pods []string) {
	t.Helper()
	named := make([]string, len(pods))
	for i, name := range pods {
		named[i] = "Pod " + name
	}
	slices.Sort(named)
	want := []string{"Created Service " + fl.ServiceName(job.Name), "Created " + strings.Join(named, ", ")}
	eventually(t, within, "the job's Service, then its workers, each told in one Event", func(ctx context.Context) (bool, error) {
		evs, err := env.Kube.EventsV1().Events(job.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		var told []eventsv1.Event
		for _, e := range evs.Items {
			if e.Reason == fl.ReasonSuccessfulCreate && e.Regarding.Name == job.Name {
				told = append(told, e)
			}
		}
		slices.SortFunc(told, func(a, b eventsv1.Event) int { return a.EventTime.Compare(b.EventTime.Time) })
		notes := make([]string, len(told))
		for i, e := range told {
			notes[i] = e.Note
		}
		if !slices.Equal(notes, want) {
			return false, fmt.Errorf("SuccessfulCreate notes in order %q, want %q", notes, want)
		}
		return true, nil
	})
}

// assertKeysByReference: a pod reads the object store's keys from the Secret by reference, and holds no key
// itself — every edge agent may read pods, and keeps their specs on its disk.
func assertKeysByReference(t *testing.T, pod *corev1.Pod, secret string) {
	t.Helper()
	refs := 0
	for _, c := range pod.Spec.Containers {
		for _, e := range c.Env {
			if e.Name != contract.EnvAccessKeyID && e.Name != contract.EnvSecretAccessKey {
				continue
			}
			if ref := e.ValueFrom; e.Value != "" || ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != secret || ref.SecretKeyRef.Key != e.Name {
				t.Errorf("%s container %s: %s = %+v, want a reference to key %s of Secret %s", pod.Name, c.Name, e.Name, e, e.Name, secret)
			}
			refs++
		}
	}
	if refs == 0 {
		t.Errorf("%s has no object store keys", pod.Name)
	}
	data, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), accessKey) || strings.Contains(string(data), secretKey) {
		t.Errorf("%s holds a credential key", pod.Name)
	}
}

func keys(m map[string]*corev1.Pod) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func controllerutilContains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestDeletedWorkerComesBackOnceAndOnlyAfterTheOldPodIsGone holds a deleted trainer with a test finalizer: no
// replacement may appear while it exists, and exactly one after, with the same identity.
func TestDeletedWorkerComesBackOnceAndOnlyAfterTheOldPodIsGone(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", nil)
	name := fl.TrainerName(job.Name, 0)
	old := workerPods(t, job)[name]
	old.Finalizers = append(old.Finalizers, "test.lifeline/hold")
	if err := env.Client.Update(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(context.Background(), old); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "Lifeline to release the deleted pod", func(ctx context.Context) (bool, error) {
		p := workerPods(t, job)[name]
		return p != nil && p.UID == old.UID && p.DeletionTimestamp != nil && !controllerutilContains(p.Finalizers, fl.WorkerFinalizer), nil
	})
	// Passes of the controller over the job, which sees the pod terminating: none may create a second pod.
	env.Passes(t, job, 2)
	if p := workerPods(t, job)[name]; p == nil || p.UID != old.UID {
		t.Fatalf("the terminating pod was replaced or lost while it still existed: %+v", p)
	}
	held := workerPods(t, job)[name]
	held.Finalizers = []string{}
	if err := env.Client.Update(context.Background(), held); err != nil {
		t.Fatal(err)
	}
	pods := waitRunning(t, job, 3)
	fresh := pods[name]
	if fresh.UID == old.UID || envOf(fresh)[contract.EnvWorkerName] != name {
		t.Errorf("replacement %s uid %s (old %s) WORKER_NAME %q", fresh.Name, fresh.UID, old.UID, envOf(fresh)[contract.EnvWorkerName])
	}
	if rec := workerRecord(getJob(t, job), name); rec.Failures != 0 {
		t.Errorf("a deletion was charged as a failure: %+v", rec)
	}
	assertCreatedOnce(t, job, name, 2)
}

// assertCreatedOnce checks the events: the identity was created exactly `times` times over the test.
func assertCreatedOnce(t testing.TB, job *v1alpha1.FederatedLearningJob, name string, times int) {
	t.Helper()
	evs, err := env.Kube.EventsV1().Events(job.Namespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range evs.Items {
		if e.Reason == fl.ReasonSuccessfulCreate && slices.Contains(createdNames(e.Note), name) {
			n += int(max(e.DeprecatedCount, 1))
			if e.Series != nil {
				n += int(e.Series.Count) - 1
			}
		}
	}
	if n != times {
		t.Errorf("%s was created %d times, want %d", name, n, times)
	}
}

// createdNames are the pods a SuccessfulCreate note names: "Created Pod a, Pod b, Service c" names a and b.
func createdNames(note string) []string {
	rest, ok := strings.CutPrefix(note, "Created ")
	if !ok {
		return nil
	}
	var pods []string
	for _, child := range strings.Split(rest, ", ") {
		if name, ok := strings.CutPrefix(child, "Pod "); ok {
			pods = append(pods, name)
		}
	}
	return pods
}

// poke makes the controller look at the job now: a backoff, deadline or TTL the clock was stepped past falls
// due at its next pass, not at the requeue it asked for on real time.
func poke(t testing.TB, job *v1alpha1.FederatedLearningJob) {
	t.Helper()
	patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"test.lifeline/poke":"%d"}}}`, time.Now().UnixNano()))
	// A pass that fell due on its own after the clock was stepped may have deleted the job already.
	if err := env.Client.Patch(context.Background(), job.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); client.IgnoreNotFound(err) != nil {
		t.Fatalf("poking %s: %v", job.Name, err)
	}
}

// stepPast steps the controller's clock just past at and pokes the job.
func stepPast(t testing.TB, job *v1alpha1.FederatedLearningJob, at time.Time) {
	t.Helper()
	env.Clock.Step(max(at.Sub(env.Clock.Now())+time.Second, 0))
	poke(t, job)
}

// A failed trainer waits out a backoff that doubles with each failure (60 s, then 120 s, on the controller's
// clock, which the test steps), and the job fails once the trainer's budget is spent.
func TestFailedWorkerIsRetriedWithGrowingBackoffUntilTheBudgetIsSpent(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", func(j *v1alpha1.FederatedLearningJob) {
		j.Spec.RunPolicy = &v1alpha1.RunPolicy{BackoffSeconds: ptr.To[int32](60), MaxBackoffSeconds: ptr.To[int32](480),
			BackoffLimitPerWorker: ptr.To[int32](2), BackoffLimit: ptr.To[int32](10)}
	})
	name := fl.TrainerName(job.Name, 1)
	for attempt := 1; attempt <= 3; attempt++ {
		pod := waitRunning(t, job, 3)[name]
		endPod(t, pod, corev1.PodFailed, 1)
		if attempt == 3 {
			break
		}
		var rec v1alpha1.WorkerStatus
		eventually(t, within, fmt.Sprintf("failure %d of %s counted, its retry waiting", attempt, name), func(ctx context.Context) (bool, error) {
			rec = workerRecord(getJob(t, job), name)
			return rec.Failures == int32(attempt) && rec.LastFailureTime != nil && strings.HasPrefix(rec.Message, "retrying after"), nil
		})
		backoff := time.Duration(60<<(attempt-1)) * time.Second
		retryAt := rec.LastFailureTime.Add(backoff)
		if !strings.Contains(rec.Message, retryAt.UTC().Format(time.RFC3339)) {
			t.Errorf("failure %d: %q, want a retry %v after the failure at %s", attempt, rec.Message, backoff, rec.LastFailureTime.UTC().Format(time.RFC3339))
		}
		if p := workerPods(t, job)[name]; p != nil && p.UID != pod.UID {
			t.Fatalf("failure %d retried before its backoff", attempt)
		}
		stepPast(t, job, retryAt)
		eventually(t, within, fmt.Sprintf("retry %d of %s once its backoff passed", attempt, name), func(ctx context.Context) (bool, error) {
			p := workerPods(t, job)[name]
			return p != nil && p.UID != pod.UID, nil
		})
	}
	got := waitCondition(t, job, v1alpha1.FLConditionFailed, fl.ReasonBackoffLimitExceeded)
	if got.Status.Phase != v1alpha1.FLJobFailed || workerRecord(got, name).Failures != 3 || got.Status.Failed != 3 {
		t.Errorf("status after the budget: phase %s, %s failures %d, failed %d", got.Status.Phase, name,
			workerRecord(got, name).Failures, got.Status.Failed)
	}
	if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.FLConditionFailed); !strings.Contains(c.Message, name) {
		t.Errorf("Failed message %q does not name the worker", c.Message)
	}
	eventually(t, within, "every active worker stopped", func(ctx context.Context) (bool, error) {
		for _, p := range workerPods(t, job) {
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				return false, fmt.Errorf("%s still running", p.Name)
			}
		}
		return true, nil
	})
	// [P-DES-4] The trainer's pod is kept, marked: no agent stands in for it any more.
	eventually(t, within, name+"'s pod marked as its job's finished", func(ctx context.Context) (bool, error) {
		p := workerPods(t, job)[name]
		return p != nil && p.Annotations[lifelinev1.WorkloadFinishedAnnotation] == "true", nil
	})
	// Terminal: the failed job is still Failed after the controller's next passes over it.
	env.Passes(t, job, 2)
	if again := getJob(t, job); !meta.IsStatusConditionTrue(again.Status.Conditions, v1alpha1.FLConditionFailed) {
		t.Errorf("Failed reverted: %+v", again.Status.Conditions)
	}
}

func TestDisruptedWorkerIsReplacedWithoutCharge(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", func(j *v1alpha1.FederatedLearningJob) {
		j.Spec.RunPolicy = &v1alpha1.RunPolicy{BackoffSeconds: ptr.To[int32](120)}
	})
	name := fl.TrainerName(job.Name, 0)
	pod := workerPods(t, job)[name]
	endPod(t, pod, corev1.PodFailed, 137, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
		Reason: "EvictionByEvictionAPI", LastTransitionTime: metav1.Now()})
	// A charged failure would wait 120 s; a disruption is replaced at once.
	eventually(t, 15*time.Second, "the disrupted trainer replaced", func(ctx context.Context) (bool, error) {
		p := workerPods(t, job)[name]
		return p != nil && p.UID != pod.UID, nil
	})
	got := getJob(t, job)
	if rec := workerRecord(got, name); rec.Failures != 0 || got.Status.Failed != 0 {
		t.Errorf("disruption was charged: %+v, failed %d", rec, got.Status.Failed)
	}
}

func TestAggregatorSuccessCompletesTheJobForGood(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning-transmitter.yaml", nil)
	pods := workerPods(t, job)
	agg := pods[fl.AggregatorName(job.Name)]
	endPod(t, agg, corev1.PodSucceeded, 0)
	got := waitCondition(t, job, v1alpha1.FLConditionComplete, fl.ReasonCompleted)
	if got.Status.Phase != v1alpha1.FLJobSucceeded || got.Status.CompletionTime == nil || got.Status.Succeeded < 1 {
		t.Errorf("status after completion: %+v", got.Status)
	}
	eventually(t, within, "trainers stopped and the aggregator released", func(ctx context.Context) (bool, error) {
		ps := workerPods(t, job)
		for i := range job.Spec.TrainingWorkers {
			if _, ok := ps[fl.TrainerName(job.Name, i)]; ok {
				return false, fmt.Errorf("trainer %d still there", i)
			}
		}
		a := ps[agg.Name]
		return a != nil && !controllerutilContains(a.Finalizers, fl.WorkerFinalizer), nil
	})
	if err := env.Client.Delete(context.Background(), agg); err != nil {
		t.Fatal(err)
	}
	// Passes of the controller over the job once it can see the pod gone: none may run a worker again.
	eventually(t, within, "the controller to see the finished aggregator gone", func(ctx context.Context) (bool, error) {
		err := env.Cached(ctx, client.ObjectKeyFromObject(agg), &corev1.Pod{})
		return apierrors.IsNotFound(err), client.IgnoreNotFound(err)
	})
	env.Passes(t, job, 2)
	if ps := workerPods(t, job); len(ps) != 0 {
		t.Errorf("a finished job ran workers again: %v", keys(ps))
	}
	if again := getJob(t, job); again.Status.Phase != v1alpha1.FLJobSucceeded {
		t.Errorf("phase after deleting the finished pod: %s", again.Status.Phase)
	}
}

// endTrainers ends every trainer of a running job with success, as trainers do when the aggregator tells them the
// training is over, and waits for the job's status to show it.
func endTrainers(t testing.TB, job *v1alpha1.FederatedLearningJob) {
	t.Helper()
	pods := waitRunning(t, job, len(job.Spec.TrainingWorkers)+1)
	for i := range job.Spec.TrainingWorkers {
		endPod(t, pods[fl.TrainerName(job.Name, i)], corev1.PodSucceeded, 0)
	}
	eventually(t, within, "every trainer recorded as succeeded", func(ctx context.Context) (bool, error) {
		got := getJob(t, job)
		return got.Status.Succeeded == int32(len(job.Spec.TrainingWorkers)), nil
	})
}

// An aggregator lost after every trainer finished is not rebuilt: a new one would wait for trainers that are gone.
func TestAggregatorLostAfterTheTrainersFinishedEndsTheJob(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", nil)
	endTrainers(t, job)
	agg := workerPods(t, job)[fl.AggregatorName(job.Name)]
	if err := env.Client.Delete(context.Background(), agg); err != nil {
		t.Fatal(err)
	}
	got := waitCondition(t, job, v1alpha1.FLConditionComplete, fl.ReasonCompleted)
	if got.Status.Phase != v1alpha1.FLJobSucceeded {
		t.Errorf("phase %s, want Succeeded", got.Status.Phase)
	}
	env.Passes(t, job, 2) // passes over the completed job, its aggregator gone: none may rebuild it
	if p, ok := workerPods(t, job)[agg.Name]; ok && p.UID != agg.UID {
		t.Errorf("the aggregator was rebuilt after the training was over (uid %s, was %s)", p.UID, agg.UID)
	}
	assertCreatedOnce(t, job, agg.Name, 1)
}

// An aggregator that runs on after every trainer finished has AggregatorGracePeriod to end; then the job
// completes and stops it.
func TestAggregatorOutlivingTheTrainersIsStoppedAfterTheGracePeriod(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", nil)
	endTrainers(t, job)
	env.Passes(t, job, 2) // passes over the job with every trainer done, within the grace period
	if got := getJob(t, job); finished(got) {
		t.Fatalf("the job finished within the grace period: %+v", got.Status.Conditions)
	}
	stepPast(t, job, env.Clock.Now().Add(fl.AggregatorGracePeriod))
	waitCondition(t, job, v1alpha1.FLConditionComplete, fl.ReasonCompleted)
	eventually(t, within, "the aggregator stopped", func(ctx context.Context) (bool, error) {
		_, ok := workerPods(t, job)[fl.AggregatorName(job.Name)]
		return !ok, nil
	})
}

func finished(job *v1alpha1.FederatedLearningJob) bool {
	return meta.IsStatusConditionTrue(job.Status.Conditions, v1alpha1.FLConditionComplete) ||
		meta.IsStatusConditionTrue(job.Status.Conditions, v1alpha1.FLConditionFailed)
}

func TestActiveDeadlineFailsTheJob(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", func(j *v1alpha1.FederatedLearningJob) {
		j.Spec.RunPolicy = &v1alpha1.RunPolicy{ActiveDeadlineSeconds: ptr.To[int64](600)}
	})
	// The pass that created the workers writes the start time after them: the workers may run before it lands.
	eventually(t, within, "the job's start time", func(context.Context) (bool, error) {
		got := getJob(t, job)
		if meta.IsStatusConditionTrue(got.Status.Conditions, v1alpha1.FLConditionFailed) {
			return false, fmt.Errorf("the running job failed: %+v", got.Status.Conditions)
		}
		return got.Status.StartTime != nil, nil
	})
	stepPast(t, job, getJob(t, job).Status.StartTime.Add(600*time.Second))
	got := waitCondition(t, job, v1alpha1.FLConditionFailed, fl.ReasonDeadlineExceeded)
	if got.Status.Phase != v1alpha1.FLJobFailed {
		t.Errorf("phase %s", got.Status.Phase)
	}
	eventually(t, within, "workers stopped", func(ctx context.Context) (bool, error) {
		return len(workerPods(t, job)) == 0, nil
	})
}

func TestTTLDeletesTheFinishedJob(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", func(j *v1alpha1.FederatedLearningJob) {
		j.Spec.RunPolicy = &v1alpha1.RunPolicy{TTLSecondsAfterFinished: ptr.To[int32](300)}
	})
	endPod(t, workerPods(t, job)[fl.AggregatorName(job.Name)], corev1.PodSucceeded, 0)
	done := waitCondition(t, job, v1alpha1.FLConditionComplete, fl.ReasonCompleted)
	if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(job), &v1alpha1.FederatedLearningJob{}); err != nil {
		t.Fatalf("the job is gone before its TTL: %v", err)
	}
	stepPast(t, job, done.Status.CompletionTime.Add(300*time.Second))
	eventually(t, within, "the job deleted after its TTL, with its pods", func(ctx context.Context) (bool, error) {
		err := env.Client.Get(ctx, client.ObjectKeyFromObject(job), &v1alpha1.FederatedLearningJob{})
		return apierrors.IsNotFound(err) && len(workerPods(t, job)) == 0, nil
	})
}

func TestJobsSideBySideNeverTouchEachOther(t *testing.T) {
	harness.SkipIfShort(t)
	a := startJob(t, "federated-learning.yaml", func(j *v1alpha1.FederatedLearningJob) {
		j.Spec.RunPolicy = &v1alpha1.RunPolicy{ActiveDeadlineSeconds: ptr.To[int64](600)}
	})
	b := loadJob(t, "federated-learning.yaml", a.Namespace)
	b.Name = "neighbour"
	if err := env.Client.Create(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	before := waitRunning(t, b, 3)
	// Job a fails by its deadline and stops its workers; b's must stay as they are.
	stepPast(t, a, getJob(t, a).Status.StartTime.Add(600*time.Second))
	waitCondition(t, a, v1alpha1.FLConditionFailed, fl.ReasonDeadlineExceeded)
	eventually(t, within, "a's workers stopped", func(ctx context.Context) (bool, error) {
		for name := range workerPods(t, a) {
			if strings.HasPrefix(name, a.Name+"-") {
				return false, nil
			}
		}
		return true, nil
	})
	after := workerPods(t, b)
	for name, p := range before {
		if !strings.HasPrefix(name, "neighbour-") {
			continue
		}
		if q := after[name]; q == nil || q.UID != p.UID || q.DeletionTimestamp != nil {
			t.Errorf("neighbour's %s was touched", name)
		}
	}
}

func TestControllerRestartMidJobCreatesNothingTwice(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", nil)
	before := workerPods(t, job)
	env.WithControllerStopped(t, func() {})
	env.Passes(t, job, 2) // passes of the new controller over the job
	after := workerPods(t, job)
	for name, p := range before {
		if q := after[name]; q == nil || q.UID != p.UID {
			t.Errorf("%s changed across a controller restart", name)
		}
	}
	if len(after) != len(before) {
		t.Errorf("pods %v after restart, %v before", keys(after), keys(before))
	}
	for name := range before {
		assertCreatedOnce(t, job, name, 1)
	}
}

func TestRecreatingTheSameNameRightAfterDeletionWorks(t *testing.T) {
	harness.SkipIfShort(t)
	job := startJob(t, "federated-learning.yaml", nil)
	old := workerPods(t, job)
	if err := env.Client.Delete(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	again := loadJob(t, "federated-learning.yaml", job.Namespace)
	eventually(t, within, "re-creating the job", func(ctx context.Context) (bool, error) {
		err := env.Client.Create(ctx, again)
		return err == nil, err
	})
	pods := waitRunning(t, again, 3)
	for name, p := range pods {
		if o := old[name]; o != nil && o.UID == p.UID {
			t.Errorf("%s is still the old job's pod", name)
		}
		if !metav1.IsControlledBy(p, again) {
			t.Errorf("%s is not owned by the new job", name)
		}
	}
}

// TestMissingCredentialIsReported: a job whose transmitter names a Secret that does not exist creates no worker
// and says which Secret is missing, though the controller reads Secrets as metadata only.
func TestMissingCredentialIsReported(t *testing.T) {
	harness.SkipIfShort(t)
	ns := env.NewNamespace(t, "fl")
	job := loadJob(t, "federated-learning-transmitter.yaml", ns)
	secret := job.Spec.Transmitter.S3.CredentialName
	if err := env.Client.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: secret}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(context.Background(), job); err != nil {
		t.Fatal(err)
	}
	eventually(t, within, "Training=False InputsNotFound naming the Secret", func(ctx context.Context) (bool, error) {
		got := getJob(t, job)
		c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.FLConditionTraining)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != fl.ReasonInputsNotFound || !strings.Contains(c.Message, "Secret "+secret) {
			return false, fmt.Errorf("Training condition %+v", c)
		}
		return true, nil
	})
	if pods := workerPods(t, job); len(pods) != 0 {
		t.Errorf("workers created without their credential: %v", keys(pods))
	}
}
