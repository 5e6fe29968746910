// Command check decodes every object of rendered Kubernetes manifests (helm template output)
// strictly into its Kubernetes API type: an unknown field, a wrong type or a kind this chart
// does not expect fails. Used by deploy/helm/test.sh.
//
//	go run . rendered.yaml...
package main

import (
	"bytes"
	"fmt"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/yaml"
)

// types maps apiVersion/kind to a fresh value of its Go type.
var types = map[string]func() any{
	"v1/ConfigMap":                              func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                                 func() any { return &corev1.Secret{} },
	"v1/Service":                                func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                         func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                        func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                       func() any { return &appsv1.StatefulSet{} },
	"policy/v1/PodDisruptionBudget":             func() any { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler":    func() any { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/Ingress":              func() any { return &networkingv1.Ingress{} },
	"networking.k8s.io/v1/NetworkPolicy":        func() any { return &networkingv1.NetworkPolicy{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":    func() any { return &gatewayv1.HTTPRoute{} },
	"monitoring.coreos.com/v1/ServiceMonitor":   func() any { return &monitoringv1.ServiceMonitor{} },
}

type meta struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Metadata   struct {
		Name string `json:"name"`
	} `json:"metadata"`
}

// checkDocs decodes each YAML document of data strictly; it returns one error per bad object
// and the number of objects checked.
func checkDocs(data []byte) (int, []error) {
	var errs []error
	n := 0
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		var m meta
		if err := yaml.Unmarshal(doc, &m); err != nil {
			errs = append(errs, fmt.Errorf("not YAML: %w", err))
			continue
		}
		key := m.APIVersion + "/" + m.Kind
		mk, ok := types[key]
		if !ok {
			errs = append(errs, fmt.Errorf("%s %s: a kind this chart does not render", key, m.Metadata.Name))
			continue
		}
		if err := yaml.UnmarshalStrict(doc, mk()); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", key, m.Metadata.Name, err))
			continue
		}
		n++
	}
	return n, errs
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			out = append(out, line)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

func main() {
	failed := false
	for _, path := range os.Args[1:] {
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		n, errs := checkDocs(data)
		for _, e := range errs {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, e)
			failed = true
		}
		fmt.Printf("%s: %d objects decoded strictly\n", path, n)
	}
	if failed {
		os.Exit(1)
	}
}
