package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is sedna.io/v1alpha1.
var GroupVersion = schema.GroupVersion{Group: "sedna.io", Version: "v1alpha1"}

var (
	// SchemeBuilder registers this package's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&JointInferenceService{}, &JointInferenceServiceList{},
		&FederatedLearningJob{}, &FederatedLearningJobList{},
		&Model{}, &ModelList{},
		&Dataset{}, &DatasetList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
