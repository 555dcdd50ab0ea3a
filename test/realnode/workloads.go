package realnode

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lifeline-edge/lifeline/cloud/api/v1alpha1"
	"github.com/lifeline-edge/lifeline/test/testkit"
)

// neverTrainerFailures is how many failures each worker of a never-trainer job is allowed.
const neverTrainerFailures = 10

// CreateNeverTrainerJob creates, in the default namespace, the FL example as job name, its trainers under
// restartPolicy Never and its aggregator never done (so the job outlives a scenario), each worker allowed
// neverTrainerFailures failures (a scenario fails one trainer again and again), with the example's Datasets and
// Model unless they are there already; tune, if any, changes the job before it is created.
func CreateNeverTrainerJob(ctx context.Context, kc client.Client, name string, tune ...func(*v1alpha1.FederatedLearningJob)) (*v1alpha1.FederatedLearningJob, error) {
	objs, err := testkit.Objects("federated-learning.yaml", FixtureVars)
	if err != nil {
		return nil, err
	}
	var job *v1alpha1.FederatedLearningJob
	for _, o := range objs {
		if j, ok := o.(*v1alpha1.FederatedLearningJob); ok {
			job = j
			continue
		}
		o.SetNamespace("default")
		if err := kc.Create(ctx, o); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("create %s %s: %w", o.GetObjectKind().GroupVersionKind().Kind, o.GetName(), err)
		}
	}
	if job == nil {
		return nil, fmt.Errorf("no FederatedLearningJob in federated-learning.yaml")
	}
	job.Namespace, job.Name = "default", name
	job.Spec.AggregationWorker.Template.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "exit_round", Value: "100000"}}
	for i := range job.Spec.TrainingWorkers {
		job.Spec.TrainingWorkers[i].Template.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
	job.Spec.RunPolicy = &v1alpha1.RunPolicy{BackoffLimit: ptr.To[int32](2 * neverTrainerFailures), BackoffLimitPerWorker: ptr.To[int32](neverTrainerFailures)}
	for _, t := range tune {
		t(job)
	}
	if err := kc.Create(ctx, job); err != nil {
		return nil, fmt.Errorf("create FederatedLearningJob %s: %w", name, err)
	}
	return job, nil
}
