package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Model is where a model's files are and how to read them.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.url`
// +kubebuilder:printcolumn:name="Format",type=string,JSONPath=`.spec.format`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Model struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ModelSpec   `json:"spec"`
	Status ModelStatus `json:"status,omitempty"`
}

// ModelSpec locates a model. A URL without a scheme is a path on the node; s3:// and http(s):// are downloaded.
type ModelSpec struct {
	// +kubebuilder:validation:MinLength=1
	URL string `json:"url"`
	// +kubebuilder:validation:MinLength=1
	Format string `json:"format"`
	// +optional
	DeviceSocVersions []string `json:"device_soc_versions,omitempty"`
	// CredentialName names a Secret with the object store's endpoint and keys.
	// +optional
	CredentialName string `json:"credentialName,omitempty"`
}

// ModelStatus is the last update of the model and the metrics reported for it.
type ModelStatus struct {
	// +optional
	UpdateTime *metav1.Time `json:"updateTime,omitempty"`
	// +optional
	Metrics []Metric `json:"metrics,omitempty"`
}

// ModelList is a list of Model.
//
// +kubebuilder:object:root=true
type ModelList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Model `json:"items"`
}
