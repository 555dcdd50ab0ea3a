package scale

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/broker"
)

// TrainersPerJob is how many edge nodes each FederatedLearningJob trains on.
const TrainersPerJob = 4

// Model names, shared by every workload of the namespace.
const (
	littleModel = "little-model"
	bigModel    = "big-model"
	flModel     = "fl-model"
)

// EdgeNodeName is the name of the i-th edge node.
func EdgeNodeName(i int) string { return fmt.Sprintf("edge-%04d", i) }

// CloudNodeName is the name of the i-th cloud node.
func CloudNodeName(i int) string { return fmt.Sprintf("cloud-%d", i) }

// jiName and flName name the i-th workloads; the i-th JI's edge worker runs on edge node i.
func jiName(i int) string { return fmt.Sprintf("ji-%04d", i) }
func flName(i int) string { return fmt.Sprintf("fl-%04d", i) }

// datasetName is the Dataset that lives on edge node i.
func datasetName(i int) string { return "data-" + EdgeNodeName(i) }

// newNode is a Node kwok plays: an edge node with KubeEdge's role label, or a cloud node.
func newNode(name string, edge bool) *corev1.Node {
	labels := map[string]string{"kubernetes.io/hostname": name, "type": "kwok", KwokLabel: kwokValue}
	if edge {
		labels[broker.EdgeNodeLabel] = ""
	}
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"),
		corev1.ResourceMemory: resource.MustParse("256Gi"), corev1.ResourcePods: resource.MustParse("1000")}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

func newModel(ns, name, url string) *v1alpha1.Model {
	return &v1alpha1.Model{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ModelSpec{URL: url, Format: "pb"}}
}

func newDataset(ns string, i int) *v1alpha1.Dataset {
	return &v1alpha1.Dataset{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: datasetName(i)},
		Spec: v1alpha1.DatasetSpec{URL: "/data/train.txt", Format: "txt", NodeName: EdgeNodeName(i)}}
}

// workerTemplate is a pod template pinned to node by nodeName, as Sedna's examples pin their workers: no
// scheduler is involved.
func workerTemplate(node, image string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		NodeName:   node,
		Containers: []corev1.Container{{Name: "worker", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
	}}
}

// newJI is the i-th JointInferenceService: its edge worker on edge node i, its cloud worker on a cloud node.
func newJI(ns string, i, cloudNodes int) *v1alpha1.JointInferenceService {
	return &v1alpha1.JointInferenceService{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: jiName(i)},
		Spec: v1alpha1.JointInferenceServiceSpec{
			EdgeWorker: v1alpha1.EdgeWorker{
				Model:             v1alpha1.ModelRef{Name: littleModel},
				HardExampleMining: v1alpha1.HardExampleMining{Name: "IBT"},
				Template:          workerTemplate(EdgeNodeName(i), "helmet-detection-little:v0.3.0"),
			},
			CloudWorker: v1alpha1.CloudWorker{
				Model:    v1alpha1.ModelRef{Name: bigModel},
				Template: workerTemplate(CloudNodeName(i%cloudNodes), "helmet-detection-big:v0.3.0"),
			},
		},
	}
}

// newFL is the i-th FederatedLearningJob: its aggregator on a cloud node, its trainers on the Datasets of edge
// nodes i, i+1, … (modulo n), so every edge node holds TrainersPerJob trainers.
func newFL(ns string, i, n, cloudNodes int) *v1alpha1.FederatedLearningJob {
	job := &v1alpha1.FederatedLearningJob{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: flName(i)},
		Spec: v1alpha1.FederatedLearningJobSpec{
			AggregationWorker: v1alpha1.AggregationWorker{
				Model:    v1alpha1.ModelRef{Name: flModel},
				Template: workerTemplate(CloudNodeName(i%cloudNodes), "surface-defect-aggregation:v0.3.0"),
			},
		},
	}
	for k := 0; k < TrainersPerJob; k++ {
		t := v1alpha1.TrainingWorker{Dataset: v1alpha1.DatasetRef{Name: datasetName((i + k) % n)},
			Template: workerTemplate("", "surface-defect-train:v0.3.0")}
		job.Spec.TrainingWorkers = append(job.Spec.TrainingWorkers, t)
	}
	return job
}
