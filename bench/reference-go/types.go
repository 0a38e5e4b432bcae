package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The Memcached API as the operator-sdk tutorial declares it: a size and a list of conditions.
// Fields of our CRD that the tutorial lacks are ignored on read.

var groupVersion = schema.GroupVersion{Group: "cache.example.com", Version: "v1alpha1"}

type MemcachedSpec struct {
	Size          int32 `json:"size,omitempty"`
	ContainerPort int32 `json:"containerPort,omitempty"`
}

type MemcachedStatus struct {
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

type Memcached struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              MemcachedSpec   `json:"spec,omitempty"`
	Status            MemcachedStatus `json:"status,omitempty"`
}

type MemcachedList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Memcached `json:"items"`
}

// Hand-written in place of controller-gen's zz_generated.deepcopy.go.

func (in *Memcached) DeepCopyInto(out *Memcached) {
	*out = *in
	out.TypeMeta = in.TypeMeta
	in.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Spec = in.Spec
	if in.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(in.Status.Conditions))
		for i := range in.Status.Conditions {
			in.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
}

func (in *Memcached) DeepCopy() *Memcached {
	if in == nil {
		return nil
	}
	out := new(Memcached)
	in.DeepCopyInto(out)
	return out
}

func (in *Memcached) DeepCopyObject() runtime.Object { return in.DeepCopy() }

func (in *MemcachedList) DeepCopyObject() runtime.Object {
	if in == nil {
		return nil
	}
	out := new(MemcachedList)
	*out = *in
	in.ListMeta.DeepCopyInto(&out.ListMeta)
	if in.Items != nil {
		out.Items = make([]Memcached, len(in.Items))
		for i := range in.Items {
			in.Items[i].DeepCopyInto(&out.Items[i])
		}
	}
	return out
}

func addToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(groupVersion, &Memcached{}, &MemcachedList{})
	metav1.AddToGroupVersion(s, groupVersion)
	return nil
}
