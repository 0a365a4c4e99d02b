package deploy

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// kustomizations are the layouts under kubernetes/ that must build.
var kustomizations = []string{"kubernetes/base", "kubernetes/overlays/eu"}

// manifests is a kustomization's output, each object decoded strictly into
// its Kubernetes (or prometheus-operator) type.
type manifests struct {
	dir             string
	namespace       string
	services        []*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	statefulSets    []*appsv1.StatefulSet
	deployments     []*appsv1.Deployment
	daemonSets      []*appsv1.DaemonSet
	pdbs            []*policyv1.PodDisruptionBudget
	networkPolicies []*networkingv1.NetworkPolicy
	serviceMonitors []*monitoringv1.ServiceMonitor
	namespaces      []*corev1.Namespace
}

// render builds a kustomization as `kubectl apply -k` would, and decodes
// every object strictly: a field the type does not have is an error.
func render(t *testing.T, dir string) *manifests {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	m := &manifests{dir: dir, configMaps: map[string]*corev1.ConfigMap{}}
	for _, r := range rm.Resources() {
		b, err := r.AsYAML()
		if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(b, &tm); err != nil {
			t.Fatal(err)
		}
		var obj any
		switch tm.APIVersion + "/" + tm.Kind {
		case "v1/Namespace":
			o := &corev1.Namespace{}
			m.namespaces, obj = append(m.namespaces, o), o
		case "v1/Service":
			o := &corev1.Service{}
			m.services, obj = append(m.services, o), o
		case "v1/ConfigMap":
			o := &corev1.ConfigMap{}
			obj = o
			defer func() { m.configMaps[o.Name] = o }()
		case "apps/v1/StatefulSet":
			o := &appsv1.StatefulSet{}
			m.statefulSets, obj = append(m.statefulSets, o), o
		case "apps/v1/Deployment":
			o := &appsv1.Deployment{}
			m.deployments, obj = append(m.deployments, o), o
		case "apps/v1/DaemonSet":
			o := &appsv1.DaemonSet{}
			m.daemonSets, obj = append(m.daemonSets, o), o
		case "policy/v1/PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			m.pdbs, obj = append(m.pdbs, o), o
		case "networking.k8s.io/v1/NetworkPolicy":
			o := &networkingv1.NetworkPolicy{}
			m.networkPolicies, obj = append(m.networkPolicies, o), o
		case "monitoring.coreos.com/v1/ServiceMonitor":
			o := &monitoringv1.ServiceMonitor{}
			m.serviceMonitors, obj = append(m.serviceMonitors, o), o
		default:
			t.Errorf("%s: %s %s: a kind this test does not decode", dir, tm.APIVersion, tm.Kind)
			continue
		}
		if err := yaml.UnmarshalStrict(b, obj); err != nil {
			t.Errorf("%s: %s %s: %v", dir, tm.Kind, r.GetName(), err)
		}
		if ns := r.GetNamespace(); ns != "" {
			m.namespace = ns
		}
	}
	return m
}

// workload is a pod template with what made it.
type workload struct {
	kind, name  string
	replicas    int
	serviceName string
	selector    *metav1.LabelSelector
	template    *corev1.PodTemplateSpec
	claims      []corev1.PersistentVolumeClaim
}

func (m *manifests) workloads() []workload {
	var out []workload
	for _, s := range m.statefulSets {
		out = append(out, workload{"StatefulSet", s.Name, int(ptrOr(s.Spec.Replicas, 1)), s.Spec.ServiceName, s.Spec.Selector, &s.Spec.Template, s.Spec.VolumeClaimTemplates})
	}
	for _, d := range m.daemonSets {
		out = append(out, workload{"DaemonSet", d.Name, 1, "", d.Spec.Selector, &d.Spec.Template, nil})
	}
	for _, d := range m.deployments {
		out = append(out, workload{"Deployment", d.Name, int(ptrOr(d.Spec.Replicas, 1)), "", d.Spec.Selector, &d.Spec.Template, nil})
	}
	return out
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

func selects(sel map[string]string, l map[string]string) bool {
	return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(l))
}

func labelSelects(t *testing.T, sel *metav1.LabelSelector, l map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Errorf("selector %v: %v", sel, err)
		return false
	}
	return !s.Empty() && s.Matches(labels.Set(l))
}

// allContainers lists a pod's init containers, then its containers.
func allContainers(spec *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}

// containerPort resolves a probe's or Service's port (a number or a name)
// among ports.
func containerPort(ports []corev1.ContainerPort, p intstr.IntOrString) (corev1.ContainerPort, bool) {
	for _, cp := range ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp, true
		}
	}
	return corev1.ContainerPort{}, false
}

func podPorts(spec *corev1.PodSpec) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, c := range allContainers(spec) {
		out = append(out, c.Ports...)
	}
	return out
}

// certSecrets runs certs.sh as an operator would, for region, and returns
// the Secrets it makes: name → directory of its keys. EXTRA_SANS adds
// 127.0.0.1 to the coordinators' certificate, which the loopback run dials.
func certSecrets(t *testing.T, region, namespace string) map[string]string {
	t.Helper()
	return certSecretsIn(t, t.TempDir(), region, namespace)
}

// certSecretsIn runs certs.sh with out as its output directory: run again
// for another region, it keeps the CA and makes that region's Secrets.
func certSecretsIn(t *testing.T, out, region, namespace string) map[string]string {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("certs.sh needs openssl (scripts/test.sh installs it): %v", err)
	}
	cmd := exec.Command("bash", "kubernetes/certs.sh", out, region, namespace)
	cmd.Env = append(os.Environ(), "EXTRA_SANS=IP:127.0.0.1")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("certs.sh: %v\n%s", err, b)
	}
	secrets := map[string]string{}
	for _, m := range regexp.MustCompile(`create secret generic (\S+) ((?:--from-file=\S+ ?)+)`).FindAllStringSubmatch(string(b), -1) {
		dir := ""
		for _, f := range strings.Fields(m[2]) {
			p := strings.TrimPrefix(f, "--from-file=")
			if dir != "" && filepath.Dir(p) != dir {
				t.Fatalf("certs.sh: secret %s from two directories", m[1])
			}
			dir = filepath.Dir(p)
		}
		secrets[m[1]] = dir
	}
	if len(secrets) == 0 {
		t.Fatalf("certs.sh printed no kubectl commands:\n%s", b)
	}
	return secrets
}

// TestManifests decodes every kustomization strictly and checks what ties
// the objects together: selectors, Services' target ports, probes,
// disruption budgets, ServiceMonitors, every ConfigMap and Secret named,
// and every flag and ALLOT_* variable given to a binary.
func TestManifests(t *testing.T) {
	bin := binaries(t)
	flagSets := map[string]map[string]bool{}
	helps := map[string]string{}
	flagsFor := func(argv []string) (map[string]bool, string) {
		key := strings.Join(argv, " ")
		if _, ok := flagSets[key]; !ok {
			flagSets[key], helps[key] = flagsOf(t, argv...)
		}
		return flagSets[key], helps[key]
	}
	secrets := certSecrets(t, "eu", "allot")
	for _, dir := range kustomizations {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m := render(t, dir)
			checkManifests(t, m, bin, secrets, flagsFor)
		})
	}
}

func checkManifests(t *testing.T, m *manifests, bin string, secrets map[string]string, flagsFor func([]string) (map[string]bool, string)) {
	wls := m.workloads()
	if len(m.statefulSets) != 2 || len(m.daemonSets) != 1 || len(m.deployments) != 1 {
		t.Errorf("%d StatefulSets, %d DaemonSets, %d Deployments; want etcd and coordinators, the agent, the gateway",
			len(m.statefulSets), len(m.daemonSets), len(m.deployments))
	}
	for _, s := range m.statefulSets {
		if ptrOr(s.Spec.Replicas, 1) != 3 {
			t.Errorf("StatefulSet %s: %d replicas, want 3", s.Name, ptrOr(s.Spec.Replicas, 1))
		}
	}
	for _, w := range wls {
		what := w.kind + " " + w.name
		if !labelSelects(t, w.selector, w.template.Labels) {
			t.Errorf("%s: selector %v does not select its pods %v", what, w.selector.MatchLabels, w.template.Labels)
		}
		if w.kind == "StatefulSet" {
			if s := m.service(w.serviceName); s == nil || s.Spec.ClusterIP != corev1.ClusterIPNone || !selects(s.Spec.Selector, w.template.Labels) {
				t.Errorf("%s: serviceName %q is not a headless Service selecting its pods", what, w.serviceName)
			}
		}
		spec := &w.template.Spec
		if spec.SecurityContext == nil || !ptrOr(spec.SecurityContext.RunAsNonRoot, false) {
			t.Errorf("%s: pods do not run as non-root", what)
		}
		vols := map[string]bool{}
		for _, v := range spec.Volumes {
			vols[v.Name] = true
			switch {
			case v.ConfigMap != nil:
				cm := m.configMaps[v.ConfigMap.Name]
				if cm == nil {
					t.Errorf("%s: volume %s: no ConfigMap %s", what, v.Name, v.ConfigMap.Name)
				}
			case v.Secret != nil:
				dir, ok := secrets[v.Secret.SecretName]
				if !ok {
					t.Errorf("%s: volume %s: Secret %s is not one certs.sh makes", what, v.Name, v.Secret.SecretName)
				}
				for _, it := range v.Secret.Items {
					if _, err := os.Stat(filepath.Join(dir, it.Key)); err != nil {
						t.Errorf("%s: volume %s: Secret %s has no key %s", what, v.Name, v.Secret.SecretName, it.Key)
					}
				}
			}
		}
		for _, c := range w.claims {
			vols[c.Name] = true
		}
		for i, c := range allContainers(spec) {
			oneShot := i < len(spec.InitContainers) && c.RestartPolicy == nil
			cwhat := what + " container " + c.Name
			for _, vm := range c.VolumeMounts {
				if !vols[vm.Name] {
					t.Errorf("%s: mounts volume %s, which the pod does not have", cwhat, vm.Name)
				}
			}
			for _, ef := range c.EnvFrom {
				if ef.ConfigMapRef != nil && m.configMaps[ef.ConfigMapRef.Name] == nil {
					t.Errorf("%s: envFrom ConfigMap %s does not exist", cwhat, ef.ConfigMapRef.Name)
				}
			}
			for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
				switch {
				case p == nil:
				case p.Exec != nil:
					t.Errorf("%s: an exec probe: the image has no shell or tools", cwhat)
				case p.HTTPGet != nil:
					if _, ok := containerPort(c.Ports, p.HTTPGet.Port); !ok {
						t.Errorf("%s: probe port %s is not one of the container's ports", cwhat, p.HTTPGet.Port.String())
					}
					if p.HTTPGet.Path == "" {
						t.Errorf("%s: probe without a path", cwhat)
					}
				case p.TCPSocket != nil:
					if _, ok := containerPort(c.Ports, p.TCPSocket.Port); !ok {
						t.Errorf("%s: probe port %s is not one of the container's ports", cwhat, p.TCPSocket.Port.String())
					}
				}
			}
			if len(c.Command) == 0 {
				t.Errorf("%s: no command", cwhat)
				continue
			}
			if c.ReadinessProbe == nil && !oneShot {
				t.Errorf("%s: no readiness probe", cwhat)
			}
			checkFlags(t, m, cwhat, c, bin, flagsFor)
		}
	}

	for _, s := range m.services {
		var sel []workload
		for _, w := range wls {
			if selects(s.Spec.Selector, w.template.Labels) {
				sel = append(sel, w)
			}
		}
		if len(sel) == 0 {
			t.Errorf("Service %s selects no pods", s.Name)
		}
		for _, sp := range s.Spec.Ports {
			for _, w := range sel {
				cp, ok := containerPort(podPorts(&w.template.Spec), sp.TargetPort)
				if !ok || cp.Protocol != sp.Protocol && !(cp.Protocol == "" && sp.Protocol == corev1.ProtocolTCP) && !(sp.Protocol == "" && cp.Protocol == corev1.ProtocolTCP) {
					t.Errorf("Service %s port %s: target %s is not a %s port of %s %s", s.Name, sp.Name, sp.TargetPort.String(), sp.Protocol, w.kind, w.name)
				}
			}
		}
	}
	for _, p := range m.pdbs {
		n := 0
		for _, w := range wls {
			if labelSelects(t, p.Spec.Selector, w.template.Labels) {
				n++
				if w.kind == "DaemonSet" {
					continue
				}
				allowed := w.replicas
				if p.Spec.MinAvailable != nil {
					allowed = w.replicas - p.Spec.MinAvailable.IntValue()
				} else if p.Spec.MaxUnavailable != nil {
					allowed = p.Spec.MaxUnavailable.IntValue()
				}
				if allowed < 1 || allowed >= w.replicas {
					t.Errorf("PodDisruptionBudget %s lets %d of %s %s's %d pods go at once; want at least 1 and fewer than all", p.Name, allowed, w.kind, w.name, w.replicas)
				}
			}
		}
		if n != 1 {
			t.Errorf("PodDisruptionBudget %s selects %d workloads, want 1", p.Name, n)
		}
	}
	for _, w := range wls {
		if w.kind == "DaemonSet" {
			continue
		}
		covered := false
		for _, p := range m.pdbs {
			covered = covered || labelSelects(t, p.Spec.Selector, w.template.Labels)
		}
		if !covered {
			t.Errorf("%s %s has no PodDisruptionBudget", w.kind, w.name)
		}
	}
	for _, sm := range m.serviceMonitors {
		var svcs []*corev1.Service
		for _, s := range m.services {
			if labelSelects(t, &sm.Spec.Selector, s.Labels) {
				svcs = append(svcs, s)
			}
		}
		if len(svcs) == 0 {
			t.Errorf("ServiceMonitor %s selects no Service", sm.Name)
		}
		for _, ep := range sm.Spec.Endpoints {
			for _, s := range svcs {
				if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) {
					t.Errorf("ServiceMonitor %s: Service %s has no port %q", sm.Name, s.Name, ep.Port)
				}
			}
			if tc := ep.TLSConfig; tc != nil && tc.CA.Secret != nil {
				if dir, ok := secrets[tc.CA.Secret.Name]; !ok {
					t.Errorf("ServiceMonitor %s: Secret %s is not one certs.sh makes", sm.Name, tc.CA.Secret.Name)
				} else if _, err := os.Stat(filepath.Join(dir, tc.CA.Secret.Key)); err != nil {
					t.Errorf("ServiceMonitor %s: Secret %s has no key %s", sm.Name, tc.CA.Secret.Name, tc.CA.Secret.Key)
				}
			}
		}
	}
	components := map[string]bool{}
	for _, sm := range m.serviceMonitors {
		components[sm.Spec.Selector.MatchLabels["app.kubernetes.io/component"]] = true
	}
	for _, c := range []string{"coordinator", "agent", "gateway"} {
		if !components[c] {
			t.Errorf("no ServiceMonitor for the %s", c)
		}
	}
	for _, np := range m.networkPolicies {
		n := 0
		for _, w := range wls {
			if labelSelects(t, &np.Spec.PodSelector, w.template.Labels) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("NetworkPolicy %s selects no pods", np.Name)
		}
	}

	// The coordinators' budgets and the agents' rules and regions agree.
	budgets, rulesCM, region := m.configMaps["allot-budgets"], m.configMaps["allot-rules"], m.regionConfigMap()
	if budgets == nil || rulesCM == nil || region == nil {
		t.Fatalf("want ConfigMaps allot-budgets, allot-rules and allot-region; have %v", mapsKeys(m.configMaps))
	}
	var doc struct {
		Regions []string `json:"regions"`
		Rules   string   `json:"rules"`
	}
	if err := yaml.Unmarshal([]byte(budgets.Data["budgets.yaml"]), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Rules != rulesCM.Data["rules.yaml"] {
		t.Errorf("the budgets document's inline rules differ from the agents' rules.yaml")
	}
	if got := strings.Join(doc.Regions, ","); got != region.Data["ALLOT_REGIONS"] {
		t.Errorf("budgets regions %s, agents' ALLOT_REGIONS %s", got, region.Data["ALLOT_REGIONS"])
	}
	if !slices.Contains(doc.Regions, region.Data["ALLOT_REGION"]) {
		t.Errorf("ALLOT_REGION %s is not one of the budgets' regions %v", region.Data["ALLOT_REGION"], doc.Regions)
	}
	// The budgets document passes the coordinator's own check.
	f := filepath.Join(t.TempDir(), "budgets.yaml")
	if err := os.WriteFile(f, []byte(budgets.Data["budgets.yaml"]), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(filepath.Join(bin, "coordinator"), "rules", "check", "-f", f).CombinedOutput(); err != nil {
		t.Errorf("coordinator rules check: %v\n%s", err, b)
	}
}

func (m *manifests) service(name string) *corev1.Service {
	for _, s := range m.services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// regionConfigMap is allot-region, whose generated name carries a hash.
func (m *manifests) regionConfigMap() *corev1.ConfigMap {
	for name, cm := range m.configMaps {
		if strings.HasPrefix(name, "allot-region") {
			return cm
		}
	}
	return nil
}

func mapsKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// etcdFlagRE finds the flags in etcd's --help.
var etcdFlagRE = regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)`)

// checkFlags checks that every flag a container passes, and every ALLOT_*
// variable it sets, is one its binary reads: the image's binaries by their
// -h (agent: ALLOT_ and any flag's name; coordinator: the variables its
// usage names), etcd by the etcd on this machine's --help.
func checkFlags(t *testing.T, m *manifests, what string, c *corev1.Container, bin string, flagsFor func([]string) (map[string]bool, string)) {
	name := filepath.Base(c.Command[0])
	var flags map[string]bool
	var help string
	switch {
	case slices.Contains(imageBinaries, name):
		if c.Command[0] != "/usr/local/bin/"+name {
			t.Errorf("%s: command %s, the image has /usr/local/bin/%s", what, c.Command[0], name)
		}
		flags, help = flagsFor(append([]string{filepath.Join(bin, name)}, c.Command[1:]...))
	case name == "etcd":
		etcd, err := exec.LookPath("etcd")
		if err != nil {
			t.Fatalf("%s: etcd is not installed (scripts/test.sh installs it)", what)
		}
		b, _ := exec.Command(etcd, "--help").CombinedOutput()
		flags = map[string]bool{}
		for _, m := range etcdFlagRE.FindAllStringSubmatch(string(b), -1) {
			flags[m[1]] = true
		}
	default:
		t.Errorf("%s: command %v is none of the image's binaries nor etcd", what, c.Command)
		return
	}
	for _, a := range append(slices.Clone(c.Command[1:]), c.Args...) {
		if !strings.HasPrefix(a, "-") {
			if len(c.Args) > 0 && slices.Contains(c.Args, a) {
				t.Errorf("%s: argument %q is not a flag (write -name=value)", what, a)
			}
			continue
		}
		f, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !flags[f] {
			t.Errorf("%s: flag -%s does not exist", what, f)
		}
	}
	env := map[string]bool{}
	for _, e := range c.Env {
		env[e.Name] = true
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil && m.configMaps[ef.ConfigMapRef.Name] != nil {
			for k := range m.configMaps[ef.ConfigMapRef.Name].Data {
				env[k] = true
			}
		}
	}
	for e := range env {
		switch {
		case e == "GOMEMLIMIT" || e == "GOGC" || e == "GOMAXPROCS":
			// The Go runtime of every binary reads these.
		case strings.HasPrefix(e, "ALLOT_") && name == "agent":
			f := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(e, "ALLOT_"), "_", "-"))
			if !flags[f] {
				t.Errorf("%s: %s names no agent flag (-%s)", what, e, f)
			}
		case strings.HasPrefix(e, "ALLOT_"):
			if !strings.Contains(help, "$"+e) {
				t.Errorf("%s: %s is not read by %s (its usage does not name it)", what, e, name)
			}
		default:
			used := false
			for _, a := range append(slices.Clone(c.Args), c.Command...) {
				used = used || strings.Contains(a, "$("+e+")")
			}
			if !used {
				t.Errorf("%s: variable %s is neither read by %s nor used in its arguments", what, e, name)
			}
		}
	}
}

// TestREADMEAgentCommand: the README's production agent command pastes
// as one command (bash runs it with agent as a function printing its
// arguments), and every flag it gives exists.
func TestREADMEAgentCommand(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)\n(agent -region eu -name eu-a .*?)\n# `).FindSubmatch(b)
	if m == nil {
		t.Fatal("README: no production agent command (agent -region eu -name eu-a ...)")
	}
	out, err := exec.Command("bash", "-c", "agent() { printf '%s\\n' \"$@\"; }\n"+string(m[1])).CombinedOutput()
	if err != nil {
		t.Fatalf("bash ran the README's command: %v\n%s", err, out)
	}
	flags, _ := flagsOf(t, filepath.Join(binaries(t), "agent"))
	n := 0
	for _, a := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(a, "-") {
			n++
			if !flags[strings.TrimLeft(a, "-")] {
				t.Errorf("README agent command: flag %s does not exist", a)
			}
		}
	}
	if n < 10 {
		t.Errorf("README agent command reached the agent with %d flags, want all of them:\n%s", n, bytes.TrimSpace(out))
	}
}
