// Package v1alpha1 holds the sedna.io/v1alpha1 API that Lifeline serves: JointInferenceService,
// FederatedLearningJob, Model and Dataset.
//
// The JSON field names are Sedna's, so Sedna YAML applies unchanged. Fields Lifeline adds are optional and
// defaulted so that Sedna YAML means the same; docs/api.md lists which fields are whose.
//
// +kubebuilder:object:generate=true
// +groupName=sedna.io
package v1alpha1
