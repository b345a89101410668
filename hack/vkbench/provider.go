package main

import (
	"context"
	"io"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
)

// memProvider keeps Pods in memory. Every method is safe to call concurrently; returned Pods are
// copies, and the notify callback is called without the lock held.
type memProvider struct {
	mu     sync.Mutex
	pods   map[string]*corev1.Pod
	notify func(*corev1.Pod)
}

func key(namespace, name string) string { return namespace + "/" + name }

// CreatePod stores the Pod as Running with every container running, and pushes that status.
func (p *memProvider) CreatePod(_ context.Context, pod *corev1.Pod) error {
	running := pod.DeepCopy()
	now := metav1.Now()
	running.Status = corev1.PodStatus{
		Phase:     corev1.PodRunning,
		HostIP:    "127.0.0.1",
		PodIP:     "127.0.0.1",
		StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
	}
	for _, c := range pod.Spec.Containers {
		running.Status.ContainerStatuses = append(running.Status.ContainerStatuses, corev1.ContainerStatus{
			Name:    c.Name,
			Image:   c.Image,
			ImageID: c.Image,
			Ready:   true,
			Started: ptr(true),
			State:   corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	p.mu.Lock()
	p.pods[key(pod.Namespace, pod.Name)] = running
	notify := p.notify
	p.mu.Unlock()
	notify(running.DeepCopy())
	return nil
}

// UpdatePod replaces the stored spec and keeps the stored status.
func (p *memProvider) UpdatePod(_ context.Context, pod *corev1.Pod) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := key(pod.Namespace, pod.Name)
	old, ok := p.pods[k]
	if !ok {
		return errdefs.NotFoundf("pod %s not found", k)
	}
	updated := pod.DeepCopy()
	updated.Status = old.Status
	p.pods[k] = updated
	return nil
}

// DeletePod forgets the Pod and pushes a terminal status; a second call finds nothing.
func (p *memProvider) DeletePod(_ context.Context, pod *corev1.Pod) error {
	k := key(pod.Namespace, pod.Name)
	p.mu.Lock()
	stored, ok := p.pods[k]
	delete(p.pods, k)
	notify := p.notify
	p.mu.Unlock()
	if !ok {
		return errdefs.NotFoundf("pod %s not found", k)
	}
	done := stored.DeepCopy()
	now := metav1.Now()
	done.Status.Phase = corev1.PodSucceeded
	done.Status.Reason = "ProviderPodDeleted"
	for i := range done.Status.ContainerStatuses {
		cs := &done.Status.ContainerStatuses[i]
		started := now
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt
		}
		cs.Ready = false
		cs.Started = ptr(false)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			Reason: "Deleted", StartedAt: started, FinishedAt: now,
		}}
	}
	notify(done)
	return nil
}

// GetPod returns a copy of the stored Pod.
func (p *memProvider) GetPod(_ context.Context, namespace, name string) (*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pod, ok := p.pods[key(namespace, name)]
	if !ok {
		return nil, errdefs.NotFoundf("pod %s/%s not found", namespace, name)
	}
	return pod.DeepCopy(), nil
}

// GetPodStatus returns a copy of the stored Pod's status.
func (p *memProvider) GetPodStatus(ctx context.Context, namespace, name string) (*corev1.PodStatus, error) {
	pod, err := p.GetPod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return &pod.Status, nil
}

// GetPods returns copies of every stored Pod.
func (p *memProvider) GetPods(context.Context) ([]*corev1.Pod, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*corev1.Pod, 0, len(p.pods))
	for _, pod := range p.pods {
		out = append(out, pod.DeepCopy())
	}
	return out, nil
}

// NotifyPods registers the status callback; it does not block.
func (p *memProvider) NotifyPods(_ context.Context, f func(*corev1.Pod)) {
	p.mu.Lock()
	p.notify = f
	p.mu.Unlock()
}

func (p *memProvider) GetContainerLogs(context.Context, string, string, string, api.ContainerLogOpts) (io.ReadCloser, error) {
	return nil, errdefs.InvalidInput("logs are not supported")
}

func (p *memProvider) RunInContainer(context.Context, string, string, string, []string, api.AttachIO) error {
	return errdefs.InvalidInput("exec is not supported")
}

func (p *memProvider) AttachToContainer(context.Context, string, string, string, api.AttachIO) error {
	return errdefs.InvalidInput("attach is not supported")
}

func (p *memProvider) GetStatsSummary(context.Context) (*statsv1alpha1.Summary, error) {
	return &statsv1alpha1.Summary{}, nil
}

func (p *memProvider) GetMetricsResource(context.Context) ([]*dto.MetricFamily, error) {
	return nil, nil
}

func (p *memProvider) PortForward(context.Context, string, string, int32, io.ReadWriteCloser) error {
	return errdefs.InvalidInput("port forwarding is not supported")
}

func ptr[T any](v T) *T { return &v }
