package federatedlearning_test

import (
	"context"
	"testing"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/cloud/contract"
	fl "github.com/lifeline-edge/lifeline/cloud/federatedlearning"
	"github.com/lifeline-edge/lifeline/test/harness"
)

// TestJobAsSednaClientsWriteIt: what Sedna accepts runs — a pretrainedModel of {name: ""} (how Go clients on
// Sedna's types send none) means none, a Model on hdfs:// is handed to the workers as it is — and the trainers
// carry Sedna's worker-type label, "train".
func TestJobAsSednaClientsWriteIt(t *testing.T) {
	harness.SkipIfShort(t)
	ns := env.NewNamespace(t, "flsedna")
	job := loadJob(t, "federated-learning.yaml", ns)
	model := &v1alpha1.Model{}
	if err := env.Client.Get(context.Background(), objectKey(ns, job.Spec.AggregationWorker.Model.Name), model); err != nil {
		t.Fatal(err)
	}
	model.Spec.URL = "hdfs://namenode:8020/models/fl/model.pb"
	if err := env.Client.Update(context.Background(), model); err != nil {
		t.Fatal(err)
	}
	job.Spec.PretrainedModel = &v1alpha1.PretrainedModel{Name: ""}
	if err := env.Client.Create(context.Background(), job); err != nil {
		t.Fatalf("creating the job: %v", err)
	}
	pods := waitRunning(t, job, 1+len(job.Spec.TrainingWorkers))
	for name, pod := range pods {
		e := envOf(pod)
		if _, set := e[contract.EnvPretrainedModelURL]; set {
			t.Errorf("%s has %s=%q from an empty pretrainedModel", name, contract.EnvPretrainedModelURL, e[contract.EnvPretrainedModelURL])
		}
		if e[contract.EnvModelURL] != model.Spec.URL {
			t.Errorf("%s MODEL_URL = %q, want the hdfs URL as it is", name, e[contract.EnvModelURL])
		}
		want := "train"
		if name == fl.AggregatorName(job.Name) {
			want = "aggregation"
		}
		if got := pod.Labels[contract.LabelPrefix(fl.Kind)+"worker-type"]; got != want {
			t.Errorf("%s worker-type = %q, want Sedna's %q", name, got, want)
		}
	}
}

func objectKey(ns, name string) client.ObjectKey { return client.ObjectKey{Namespace: ns, Name: name} }
