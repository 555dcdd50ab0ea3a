package federatedlearning

import (
	"fmt"
	"net/url"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
)

// WorkerFinalizer holds a worker pod until the controller has counted how it ended, so a pod that finished or
// failed is never lost before it is accounted for, and a finished job never runs a worker again.
const WorkerFinalizer = "sedna.io/lifeline-worker-accounting"

// IndexLabel on a trainer pod is its index in spec.trainingWorkers.
const IndexLabel = "lifeline.sedna.io/worker-index"

// inputs is everything rendering depends on, read from the cache by the reconciler.
type inputs struct {
	job             *v1alpha1.FederatedLearningJob
	model           *v1alpha1.Model
	pretrainedModel *v1alpha1.Model // nil when the spec names none
	datasets        []*v1alpha1.Dataset
	secrets         map[string]*metav1.PartialObjectMetadata // credential Secrets, metadata only
	lcServer        string
}

// identity is one worker of a job: the aggregator, or the trainer at index.
type identity struct {
	name  string
	role  v1alpha1.WorkerRole
	index int // trainers only
}

// identities lists a job's workers, aggregator first.
func identities(job *v1alpha1.FederatedLearningJob) []identity {
	ids := []identity{{name: AggregatorName(job.Name), role: v1alpha1.WorkerRoleAggregator}}
	for i := range job.Spec.TrainingWorkers {
		ids = append(ids, identity{name: TrainerName(job.Name, i), role: v1alpha1.WorkerRoleTrainer, index: i})
	}
	return ids
}

// selectorLabels select every pod of a job (of this UID: a re-created job of the same name has others).
func selectorLabels(job *v1alpha1.FederatedLearningJob) map[string]string {
	return contract.Labels(Kind, nameLabelValue(job.Name), job.UID, "")
}

func workerLabels(job *v1alpha1.FederatedLearningJob, workerType string) map[string]string {
	return contract.Labels(Kind, nameLabelValue(job.Name), job.UID, workerType)
}

func ownerRef(job *v1alpha1.FederatedLearningJob) metav1.OwnerReference {
	return *metav1.NewControllerRef(job, v1alpha1.GroupVersion.WithKind(Kind))
}

// renderWorker renders the pod of one identity.
func renderWorker(in inputs, id identity) (*corev1.Pod, error) {
	if id.role == v1alpha1.WorkerRoleAggregator {
		return renderAggregatorPod(in)
	}
	return renderTrainerPod(in, id.index)
}

// renderAggregatorPod renders the aggregator, which waits for PARTICIPANTS_COUNT trainers.
func renderAggregatorPod(in inputs) (*corev1.Pod, error) {
	job := in.job
	env := map[string]string{contract.EnvAggBindPort: strconv.Itoa(AggregationPort)}
	storage := []contract.Storage{{EnvName: contract.EnvModelURL, URL: in.model.Spec.URL, Credential: in.credential(in.model.Spec.CredentialName)}}
	pod, err := renderPod(in, AggregatorName(job.Name), workerTypeAggregation, v1alpha1.WorkerRoleAggregator,
		job.Spec.AggregationWorker.Template, storage, env)
	if err != nil {
		return nil, fmt.Errorf("aggregator: %w", err)
	}
	return pod, nil
}

// renderTrainerPod renders the i-th trainer: on its Dataset's node unless its template places it, on the host
// network so LC_SERVER=localhost reaches the node's report endpoint, tolerating the node's disconnection.
func renderTrainerPod(in inputs, i int) (*corev1.Pod, error) {
	job := in.job
	w := job.Spec.TrainingWorkers[i]
	ds := in.datasets[i]
	env := map[string]string{
		contract.EnvAggIP:       ServiceName(job.Name) + "." + job.Namespace,
		contract.EnvAggPort:     strconv.Itoa(AggregationPort),
		contract.EnvModelName:   in.model.Name,
		contract.EnvDatasetName: ds.Name,
		contract.EnvLCServer:    in.lcServer,
	}
	storage := []contract.Storage{
		{EnvName: contract.EnvModelURL, URL: in.model.Spec.URL, Credential: in.credential(in.model.Spec.CredentialName)},
		{EnvName: contract.EnvTrainDatasetURL, URL: ds.Spec.URL, Credential: in.credential(ds.Spec.CredentialName)},
	}
	pod, err := renderPod(in, TrainerName(job.Name, i), workerTypeTraining, v1alpha1.WorkerRoleTrainer, w.Template, storage, env)
	if err != nil {
		return nil, fmt.Errorf("trainer %d: %w", i, err)
	}
	pod.Labels[IndexLabel] = strconv.Itoa(i)
	spec := &pod.Spec
	if spec.NodeName == "" && spec.NodeSelector == nil && spec.Affinity == nil {
		spec.NodeName = ds.Spec.NodeName
	}
	contract.UseHostNetwork(spec)
	contract.TolerateDisconnection(spec)
	action := v1alpha1.OfflineActionRestart
	if rp := job.Spec.RunPolicy; rp != nil && rp.TrainerOfflinePolicy != nil && rp.TrainerOfflinePolicy.Action != "" {
		action = rp.TrainerOfflinePolicy.Action
	}
	pod.Annotations[contract.OfflinePolicyAnnotation] = string(action)
	markDataset(pod, ds)
	return pod, nil
}

// markDataset tells the trainer's node agent where the Dataset's index file is, so it counts the samples as
// Sedna's local controller does: only for a node path, and the formats LC counts (txt, csv).
func markDataset(pod *corev1.Pod, ds *v1alpha1.Dataset) {
	format := strings.ToLower(ds.Spec.Format)
	if u, err := url.Parse(ds.Spec.URL); err != nil || u.Scheme != "" || (format != "txt" && format != "csv") {
		return
	}
	pod.Annotations[contract.DatasetAnnotation] = ds.Name
	pod.Annotations[contract.DatasetIndexAnnotation] = path.Clean(ds.Spec.URL)
	pod.Annotations[contract.DatasetFormatAnnotation] = format
}

func (in inputs) credential(name string) *metav1.PartialObjectMetadata {
	if name == "" {
		return nil
	}
	return in.secrets[name]
}

// renderPod builds a worker pod from its template with the contract's env and mounts common to both roles.
func renderPod(in inputs, name, workerType string, role v1alpha1.WorkerRole, tmpl corev1.PodTemplateSpec,
	storage []contract.Storage, env map[string]string) (*corev1.Pod, error) {
	job := in.job
	t := tmpl.DeepCopy()
	if in.pretrainedModel != nil {
		storage = append(storage, contract.Storage{EnvName: contract.EnvPretrainedModelURL, URL: in.pretrainedModel.Spec.URL,
			Credential: in.credential(in.pretrainedModel.Spec.CredentialName)})
	}
	storageEnv, err := contract.MountStorage(&t.Spec, storage)
	if err != nil {
		return nil, err
	}
	for k, v := range storageEnv {
		env[k] = v
	}
	transmitterEnv, credentials, err := in.transmitterEnv()
	if err != nil {
		return nil, err
	}
	for k, v := range transmitterEnv {
		env[k] = v
	}
	env[contract.EnvNamespace] = job.Namespace
	env[contract.EnvJobName] = job.Name
	env[contract.EnvWorkerName] = name
	env[contract.EnvParticipantsCount] = strconv.Itoa(len(job.Spec.TrainingWorkers))
	contract.SetEnv(&t.Spec, env, credentials...)
	if t.Spec.RestartPolicy == "" {
		t.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
	}

	labels := map[string]string{}
	for k, v := range t.Labels {
		labels[k] = v
	}
	for k, v := range workerLabels(job, workerType) {
		labels[k] = v
	}
	labels[contract.RoleLabel] = string(role)
	annotations := map[string]string{}
	for k, v := range t.Annotations {
		annotations[k] = v
	}
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Namespace:       job.Namespace,
			Labels:          labels,
			Annotations:     annotations,
			Finalizers:      []string{WorkerFinalizer},
			OwnerReferences: []metav1.OwnerReference{ownerRef(job)},
		},
		Spec: t.Spec,
	}, nil
}

// transmitterEnv is how workers exchange updates: websocket by default, or an object store, whose endpoint and
// keys (references into its Secret) come second.
func (in inputs) transmitterEnv() (map[string]string, []corev1.EnvVar, error) {
	tr := in.job.Spec.Transmitter
	if tr == nil || tr.S3 == nil {
		return map[string]string{contract.EnvTransmitter: "ws"}, nil, nil
	}
	env := map[string]string{contract.EnvTransmitter: "s3", contract.EnvAggDataPath: tr.S3.AggDataPath}
	secret := in.credential(tr.S3.CredentialName)
	if secret == nil {
		return env, nil, nil
	}
	creds, err := contract.CredentialEnv(secret)
	if err != nil {
		return nil, nil, fmt.Errorf("transmitter: %w", err)
	}
	return env, creds, nil
}

// renderAggregationService renders the Service trainers reach the aggregator through; `tcp-0` is the port name
// EdgeMesh needs.
func renderAggregationService(job *v1alpha1.FederatedLearningJob) *corev1.Service {
	labels := workerLabels(job, workerTypeAggregation)
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name: ServiceName(job.Name), Namespace: job.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{ownerRef(job)},
		},
		Spec: corev1.ServiceSpec{
			Selector: labels,
			Ports: []corev1.ServicePort{{
				Name: "tcp-0", Protocol: corev1.ProtocolTCP, Port: AggregationPort, TargetPort: intstr.FromInt32(AggregationPort),
			}},
		},
	}
}
