package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Dataset is where a data set lives; NodeName is the edge node that holds it, where its trainer runs.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.url`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Dataset struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   DatasetSpec   `json:"spec"`
	Status DatasetStatus `json:"status,omitempty"`
}

// DatasetSpec locates a data set.
type DatasetSpec struct {
	// +kubebuilder:validation:MinLength=1
	URL string `json:"url"`
	// +kubebuilder:validation:MinLength=1
	Format string `json:"format"`
	// +kubebuilder:validation:MinLength=1
	NodeName string `json:"nodeName"`
	// +optional
	CredentialName string `json:"credentialName,omitempty"`
}

// DatasetStatus is the last update of the data set.
type DatasetStatus struct {
	// +optional
	UpdateTime      *metav1.Time `json:"updateTime,omitempty"`
	NumberOfSamples int          `json:"numberOfSamples"`
}

// DatasetList is a list of Dataset.
//
// +kubebuilder:object:root=true
type DatasetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Dataset `json:"items"`
}
