package main

import (
	"context"
	"fmt"
	"os"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// The reconcile steps of the operator-sdk Go tutorial (go/v4 memcached-operator), request for
// request: status Unknown on first sight, a finalizer, Get/Create the Deployment, Update its
// replicas, then a full status Update on every pass.

const finalizer = "cache.example.com/finalizer"

type reconciler struct {
	client.Client
	scheme   *runtime.Scheme
	recorder record.EventRecorder
	// withService: a headless Service per Memcached as well, created after the Deployment as the
	// tutorial creates that, so that the benchmark can price the control plane's work for one
	// (the Service and its EndpointSlices) apart from the operators' own.
	withService bool
}

func (r *reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	mc := &Memcached{}
	if err := r.Get(ctx, req.NamespacedName, mc); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	if len(mc.Status.Conditions) == 0 {
		setAvailable(mc, metav1.ConditionUnknown, "Reconciling", "Starting reconciliation")
		if err := r.Status().Update(ctx, mc); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.Get(ctx, req.NamespacedName, mc); err != nil {
			return ctrl.Result{}, err
		}
	}

	if controllerutil.AddFinalizer(mc, finalizer) {
		if err := r.Update(ctx, mc); err != nil {
			return ctrl.Result{}, err
		}
	}

	if mc.GetDeletionTimestamp() != nil {
		return r.finalize(ctx, req, mc)
	}

	found := &appsv1.Deployment{}
	err := r.Get(ctx, req.NamespacedName, found)
	if apierrors.IsNotFound(err) {
		dep := r.deploymentFor(mc)
		if err := ctrl.SetControllerReference(mc, dep, r.scheme); err != nil {
			return ctrl.Result{}, err
		}
		if err := r.Create(ctx, dep); err != nil {
			return ctrl.Result{}, err
		}
		return ctrl.Result{RequeueAfter: time.Minute}, nil
	} else if err != nil {
		return ctrl.Result{}, err
	}

	if r.withService {
		svc := &corev1.Service{}
		err := r.Get(ctx, req.NamespacedName, svc)
		if apierrors.IsNotFound(err) {
			svc = r.serviceFor(mc)
			if err := ctrl.SetControllerReference(mc, svc, r.scheme); err != nil {
				return ctrl.Result{}, err
			}
			if err := r.Create(ctx, svc); err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{RequeueAfter: time.Minute}, nil
		} else if err != nil {
			return ctrl.Result{}, err
		}
	}

	size := mc.Spec.Size
	if found.Spec.Replicas == nil || *found.Spec.Replicas != size {
		found.Spec.Replicas = &size
		if err := r.Update(ctx, found); err != nil {
			if err := r.Get(ctx, req.NamespacedName, mc); err != nil {
				return ctrl.Result{}, err
			}
			setAvailable(mc, metav1.ConditionFalse, "Resizing", fmt.Sprintf("Failed to update the size: %s", err))
			if err := r.Status().Update(ctx, mc); err != nil {
				return ctrl.Result{}, err
			}
			return ctrl.Result{}, err
		}
		return ctrl.Result{Requeue: true}, nil
	}

	setAvailable(mc, metav1.ConditionTrue, "Reconciling",
		fmt.Sprintf("Deployment for custom resource (%s) with %d replicas created successfully", mc.Name, size))
	if err := r.Status().Update(ctx, mc); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{}, nil
}

func (r *reconciler) finalize(ctx context.Context, req ctrl.Request, mc *Memcached) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(mc, finalizer) {
		return ctrl.Result{}, nil
	}
	setCondition(mc, "Degraded", metav1.ConditionUnknown, "Finalizing", "Performing finalizer operations")
	if err := r.Status().Update(ctx, mc); err != nil {
		return ctrl.Result{}, err
	}
	r.recorder.Event(mc, "Warning", "Deleting", fmt.Sprintf("Custom Resource %s is being deleted from the namespace %s", mc.Name, mc.Namespace))
	if err := r.Get(ctx, req.NamespacedName, mc); err != nil {
		return ctrl.Result{}, err
	}
	setCondition(mc, "Degraded", metav1.ConditionTrue, "Finalizing", "Finalizer operations were successfully accomplished")
	if err := r.Status().Update(ctx, mc); err != nil {
		return ctrl.Result{}, err
	}
	controllerutil.RemoveFinalizer(mc, finalizer)
	return ctrl.Result{}, r.Update(ctx, mc)
}

func setAvailable(mc *Memcached, status metav1.ConditionStatus, reason, message string) {
	setCondition(mc, "Available", status, reason, message)
}

func setCondition(mc *Memcached, kind string, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&mc.Status.Conditions, metav1.Condition{Type: kind, Status: status, Reason: reason, Message: message})
}

func labelsFor(mc *Memcached) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "memcached",
		"app.kubernetes.io/instance":   mc.Name,
		"app.kubernetes.io/managed-by": "MemcachedController",
	}
}

func containerPort(mc *Memcached) int32 {
	if mc.Spec.ContainerPort == 0 {
		return 11211
	}
	return mc.Spec.ContainerPort
}

// serviceFor: headless, as ours is, so that clients reach each pod by name.
func (r *reconciler) serviceFor(mc *Memcached) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: mc.Name, Namespace: mc.Namespace},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  labelsFor(mc),
			Ports:     []corev1.ServicePort{{Name: "memcached", Port: containerPort(mc)}},
		},
	}
}

func (r *reconciler) deploymentFor(mc *Memcached) *appsv1.Deployment {
	labels := labelsFor(mc)
	image := os.Getenv("MEMCACHED_IMAGE")
	if image == "" {
		image = "memcached:1.6.45-alpine"
	}
	port := containerPort(mc)
	yes, no, uid := true, false, int64(1001)
	replicas := mc.Spec.Size
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: mc.Name, Namespace: mc.Namespace},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   &yes,
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            "memcached",
						Image:           image,
						ImagePullPolicy: corev1.PullIfNotPresent,
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot:             &yes,
							RunAsUser:                &uid,
							AllowPrivilegeEscalation: &no,
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						Ports:   []corev1.ContainerPort{{ContainerPort: port, Name: "memcached"}},
						Command: []string{"memcached", "--memory-limit=64", "-o", "modern", "-v"},
					}},
				},
			},
		},
	}
}

func (r *reconciler) setup(mgr ctrl.Manager, workers int) error {
	b := ctrl.NewControllerManagedBy(mgr).
		For(&Memcached{}).
		Named("memcached").
		Owns(&appsv1.Deployment{})
	if r.withService {
		b = b.Owns(&corev1.Service{})
	}
	return b.WithOptions(controller.Options{MaxConcurrentReconciles: workers}).Complete(r)
}
