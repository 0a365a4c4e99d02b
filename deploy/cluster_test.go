package deploy

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/loopback"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// cluster runs a kustomization's pods as processes on loopback, as a
// kubelet would run them: every pod's environment (downward API,
// ConfigMaps), its volumes (ConfigMaps, Secrets, claims) as directories,
// $(VAR) expanded in arguments; each mount path, and each host:port in an
// argument or variable, rewritten to the directory or loopback port that
// stands for it. A pod's ports are its own loopback ports; a Service or
// a StatefulSet pod's name resolves to the pod it names. An address the
// manifests do not define must be given in external, or the run fails, so
// the manifests cannot refer to something that does not exist.
type cluster struct {
	t        *testing.T
	m        *manifests
	bin      string
	root     string
	secrets  map[string]string
	external map[string]string // host (namespace suffix removed) → address
	pods     []*pod
	// edges are the connections the arguments ask for, for the
	// NetworkPolicy check: client pod → server pod and port.
	edges []edge
}

type pod struct {
	name  string
	wl    workload
	dir   string
	ports map[int32]int // containerPort → loopback port
	procs []*proc
}

type edge struct {
	from, to *pod
	port     corev1.ContainerPort
}

// proc is one container, restarted when it exits as a kubelet would
// (restartPolicy Always), until the cluster stops.
type proc struct {
	pod      *pod
	c        *corev1.Container
	argv     []string
	env      []string
	out      bytes.Buffer
	mu       sync.Mutex
	cmd      *exec.Cmd
	restarts int
	owned    bool // a goroutine runs it and closes done
	stopped  bool
	done     chan struct{}
}

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.out.Len() < 1<<20 {
		p.out.Write(b)
	}
	return len(b), nil
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func newCluster(t *testing.T, m *manifests, bin string, secrets, external map[string]string) *cluster {
	c := &cluster{t: t, m: m, bin: bin, root: t.TempDir(), secrets: secrets, external: external}
	for _, w := range m.workloads() {
		n := w.replicas
		if w.kind == "DaemonSet" {
			n = 1 // one node
		}
		for i := range n {
			name := fmt.Sprintf("%s-%d", w.name, i)
			if w.kind != "StatefulSet" {
				name = fmt.Sprintf("%s-%c%c%c%c%c", w.name, 'a'+i, 'x', 'q', 'z', 'v')
			}
			p := &pod{name: name, wl: w, dir: filepath.Join(c.root, name), ports: map[int32]int{}}
			for _, cp := range podPorts(&w.template.Spec) {
				if _, ok := p.ports[cp.ContainerPort]; !ok {
					p.ports[cp.ContainerPort] = freePort(t)
				}
			}
			c.pods = append(c.pods, p)
		}
	}
	t.Cleanup(c.stop)
	return c
}

// freePort returns a loopback port free for TCP and UDP (memberlist
// listens on both) a moment ago, never the same one twice in this test
// binary, picked below the kernel's ephemeral range (loopback.Port): the
// kernel hands ports from that range to outgoing connections, and one
// opened between the pick and the server's bind once took a coordinator's
// port ("address already in use").
func freePort(t *testing.T) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	p, err := loopback.Port(portsGiven)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// podsOf returns the pods of the workload named.
func (c *cluster) podsOf(workload string) []*pod {
	var out []*pod
	for _, p := range c.pods {
		if p.wl.name == workload {
			out = append(out, p)
		}
	}
	return out
}

// trimNamespace turns a cluster DNS name into the name within the
// namespace: allot-etcd-0.allot-etcd.allot.svc.cluster.local → allot-etcd-0.allot-etcd.
func (c *cluster) trimNamespace(host string) string {
	h := strings.TrimSuffix(host, ".cluster.local")
	h = strings.TrimSuffix(h, ".svc")
	if c.m.namespace != "" {
		h = strings.TrimSuffix(h, "."+c.m.namespace)
	}
	return h
}

// resolve returns the loopback address that host:port, seen from pod
// self, stands for.
func (c *cluster) resolve(self *pod, host string, port int32) (string, error) {
	local := func(p *pod, port int32) (string, error) {
		lp, ok := p.ports[port]
		if !ok {
			return "", fmt.Errorf("pod %s declares no containerPort %d", p.name, port)
		}
		if p != self {
			for _, cp := range podPorts(&p.wl.template.Spec) {
				if e := (edge{self, p, cp}); cp.ContainerPort == port && !slices.Contains(c.edges, e) {
					c.edges = append(c.edges, e)
					break
				}
			}
		}
		return fmt.Sprintf("127.0.0.1:%d", lp), nil
	}
	switch host {
	case "", "0.0.0.0", "127.0.0.1", "localhost":
		return local(self, port)
	}
	h := c.trimNamespace(host)
	if addr, ok := c.external[h]; ok {
		return addr, nil
	}
	if podName, svc, ok := strings.Cut(h, "."); ok {
		for _, p := range c.pods {
			if p.name == podName && p.wl.serviceName == svc {
				return local(p, port)
			}
		}
		return "", fmt.Errorf("no pod %s behind a Service %s", podName, svc)
	}
	s := c.m.service(h)
	if s == nil {
		return "", fmt.Errorf("no Service, pod or external address %q", host)
	}
	for _, sp := range s.Spec.Ports {
		if sp.Port != port {
			continue
		}
		// The first selected pod other than self (a join or a request to
		// oneself teaches nothing), else self.
		var pick *pod
		for _, p := range c.pods {
			if selects(s.Spec.Selector, p.wl.template.Labels) && (pick == nil || pick == self) {
				pick = p
			}
		}
		if pick == nil {
			return "", fmt.Errorf("Service %s selects no pod", s.Name)
		}
		cp, ok := containerPort(podPorts(&pick.wl.template.Spec), sp.TargetPort)
		if !ok {
			return "", fmt.Errorf("Service %s port %d: target %s not on pod %s", s.Name, port, sp.TargetPort.String(), pick.name)
		}
		return local(pick, cp.ContainerPort)
	}
	return "", fmt.Errorf("Service %s has no port %d", s.Name, port)
}

// addrRE finds host:port in an argument: "0.0.0.0:7070", ":8080",
// "http://allot-etcd-0.allot-etcd:2380", "redis-eu:6379".
var addrRE = regexp.MustCompile(`([A-Za-z0-9][A-Za-z0-9.\-]*)?:(\d{2,5})\b`)

// varRE is Kubernetes' $(VAR) reference.
var varRE = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// localize rewrites one argument or variable value for pod p's container.
func (c *cluster) localize(p *pod, s string, env map[string]string, mounts map[string]string) string {
	s = varRE.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := env[ref[2:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
	paths := slices.Collect(maps.Keys(mounts))
	slices.SortFunc(paths, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range paths {
		s = strings.ReplaceAll(s, mp, mounts[mp])
	}
	return addrRE.ReplaceAllStringFunc(s, func(hp string) string {
		m := addrRE.FindStringSubmatch(hp)
		port, _ := strconv.Atoi(m[2])
		addr, err := c.resolve(p, m[1], int32(port))
		if err != nil {
			c.t.Errorf("pod %s: %q: %v", p.name, hp, err)
			return hp
		}
		return addr
	})
}

// volumes writes pod p's volumes and returns each volume's directory.
func (c *cluster) volumes(p *pod) map[string]string {
	t := c.t
	dirs := map[string]string{}
	for _, v := range p.wl.template.Spec.Volumes {
		dir := filepath.Join(p.dir, "volumes", v.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		dirs[v.Name] = dir
		write := func(key, path string, data []byte) {
			if path == "" {
				path = key
			}
			if err := os.WriteFile(filepath.Join(dir, path), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		switch {
		case v.ConfigMap != nil:
			cm := c.m.configMaps[v.ConfigMap.Name]
			if cm == nil {
				t.Fatalf("pod %s: no ConfigMap %s", p.name, v.ConfigMap.Name)
			}
			for k, d := range cm.Data {
				write(k, "", []byte(d))
			}
		case v.Secret != nil:
			src := c.secrets[v.Secret.SecretName]
			items := v.Secret.Items
			if items == nil {
				ents, err := os.ReadDir(src)
				if err != nil {
					t.Fatalf("pod %s: Secret %s: %v", p.name, v.Secret.SecretName, err)
				}
				for _, e := range ents {
					items = append(items, corev1.KeyToPath{Key: e.Name()})
				}
			}
			for _, it := range items {
				b, err := os.ReadFile(filepath.Join(src, it.Key))
				if err != nil {
					t.Fatalf("pod %s: Secret %s: %v", p.name, v.Secret.SecretName, err)
				}
				write(it.Key, it.Path, b)
			}
		}
	}
	for _, cl := range p.wl.claims {
		dirs[cl.Name] = filepath.Join(p.dir, "volumes", cl.Name)
		if err := os.MkdirAll(dirs[cl.Name], 0o700); err != nil {
			t.Fatal(err)
		}
	}
	return dirs
}

// container prepares container ct of pod p: its argv and environment.
func (c *cluster) container(p *pod, ct *corev1.Container, vols map[string]string) *proc {
	t := c.t
	env := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, ef := range ct.EnvFrom {
		cm := c.m.configMaps[ef.ConfigMapRef.Name]
		for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
			set(k, cm.Data[k])
		}
	}
	for _, e := range ct.Env {
		switch {
		case e.ValueFrom == nil:
			set(e.Name, e.Value)
		case e.ValueFrom.FieldRef != nil:
			switch e.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				set(e.Name, p.name)
			case "metadata.namespace":
				set(e.Name, c.m.namespace)
			case "status.podIP":
				set(e.Name, "127.0.0.1")
			default:
				t.Fatalf("pod %s: field %s not emulated", p.name, e.ValueFrom.FieldRef.FieldPath)
			}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			set(e.Name, c.m.configMaps[e.ValueFrom.ConfigMapKeyRef.Name].Data[e.ValueFrom.ConfigMapKeyRef.Key])
		default:
			t.Fatalf("pod %s: variable %s: source not emulated", p.name, e.Name)
		}
	}
	mounts := map[string]string{}
	for _, vm := range ct.VolumeMounts {
		mounts[vm.MountPath] = vols[vm.Name]
	}
	var envList []string
	final := map[string]string{}
	for _, k := range order {
		final[k] = c.localize(p, env[k], final, mounts)
		envList = append(envList, k+"="+final[k])
	}
	var argv []string
	for _, a := range append(slices.Clone(ct.Command), ct.Args...) {
		argv = append(argv, c.localize(p, a, final, mounts))
	}
	name := filepath.Base(ct.Command[0])
	if slices.Contains(imageBinaries, name) {
		argv[0] = filepath.Join(c.bin, name)
	} else {
		path, err := exec.LookPath(name)
		if err != nil {
			t.Fatalf("pod %s: %s is not installed", p.name, name)
		}
		argv[0] = path
	}
	return &proc{pod: p, c: ct, argv: argv, env: envList, done: make(chan struct{})}
}

// start runs every pod: one-shot init containers to success (retried like
// a kubelet retries them), then sidecars and containers, restarted when
// they exit. Pods start together, as on a cluster: a container that needs
// another pod (a coordinator needs etcd) fails and is restarted until it
// is there.
func (c *cluster) start() {
	for _, p := range c.pods {
		vols := c.volumes(p)
		spec := &p.wl.template.Spec
		var init, run []*proc
		for i := range spec.InitContainers {
			ct := &spec.InitContainers[i]
			pr := c.container(p, ct, vols)
			if ct.RestartPolicy != nil && *ct.RestartPolicy == corev1.ContainerRestartPolicyAlways {
				run = append(run, pr)
			} else {
				init = append(init, pr)
			}
		}
		for i := range spec.Containers {
			run = append(run, c.container(p, &spec.Containers[i], vols))
		}
		p.procs = append(init, run...)
		go func() {
			for _, pr := range init {
				if !pr.own() || !pr.runToSuccess(60*time.Second) {
					return
				}
			}
			for _, pr := range run {
				if pr.own() {
					go pr.supervise()
				}
			}
		}()
	}
}

// own marks the container as run by a goroutine, which closes done when it
// ends; false once the cluster stops.
func (pr *proc) own() bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.stopped {
		return false
	}
	pr.owned = true
	return true
}

func (pr *proc) launch() (*exec.Cmd, error) {
	cmd := exec.Command(pr.argv[0], pr.argv[1:]...)
	cmd.Env = pr.env
	cmd.Dir = pr.pod.dir
	cmd.Stdout, cmd.Stderr = pr, pr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.stopped {
		return nil, fmt.Errorf("stopped")
	}
	pr.cmd = cmd
	return cmd, cmd.Start()
}

// exited records an exit; it reports whether to go on.
func (pr *proc) exited(err error) bool {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.stopped {
		return false
	}
	pr.restarts++
	fmt.Fprintf(&pr.out, "\n[test] exited (%v); restarting\n", err)
	return true
}

func (pr *proc) runToSuccess(limit time.Duration) bool {
	defer close(pr.done)
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(time.Second) {
		cmd, err := pr.launch()
		if err == nil {
			if err = cmd.Wait(); err == nil {
				return true
			}
		}
		if !pr.exited(err) {
			return false
		}
	}
	return false
}

func (pr *proc) supervise() {
	defer close(pr.done)
	for {
		cmd, err := pr.launch()
		if err == nil {
			err = cmd.Wait()
		}
		if !pr.exited(err) {
			return
		}
		time.Sleep(time.Second)
	}
}

// kill stops the container for good with sig.
func (pr *proc) kill(sig syscall.Signal) {
	pr.mu.Lock()
	pr.stopped = true
	cmd := pr.cmd
	pr.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, sig)
	}
}

// stop ends every container (SIGTERM, then SIGKILL after 10 s) and, when
// the test failed, logs each one's output.
func (c *cluster) stop() {
	var all []*proc
	for _, p := range c.pods {
		all = append(all, p.procs...)
	}
	for _, pr := range all {
		pr.kill(syscall.SIGTERM)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pr := range all {
		pr.mu.Lock()
		owned := pr.owned
		pr.mu.Unlock()
		if !owned {
			continue
		}
		select {
		case <-pr.done:
		case <-time.After(time.Until(deadline)):
			pr.kill(syscall.SIGKILL)
			<-pr.done
		}
	}
	if c.t.Failed() {
		for _, pr := range all {
			c.t.Logf("pod %s container %s (%d restarts): %v\n%s", pr.pod.name, pr.c.Name, pr.restarts, pr.argv, tail(pr.output(), 3000))
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// httpClient is a kubelet's probe client: HTTPS without verification.
var probeClient = &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
	TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // kubelet probes do not verify
}}

// probe runs an HTTP or TCP probe of container ct in pod p once.
func (c *cluster) probe(p *pod, ct *corev1.Container, pr *corev1.Probe) error {
	switch {
	case pr.HTTPGet != nil:
		cp, _ := containerPort(ct.Ports, pr.HTTPGet.Port)
		scheme := "http"
		if pr.HTTPGet.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		res, err := probeClient.Get(fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, p.ports[cp.ContainerPort], pr.HTTPGet.Path))
		if err != nil {
			return err
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode < 200 || res.StatusCode >= 400 {
			return fmt.Errorf("%s %s: %d %s", scheme, pr.HTTPGet.Path, res.StatusCode, bytes.TrimSpace(b))
		}
		return nil
	case pr.TCPSocket != nil:
		cp, _ := containerPort(ct.Ports, pr.TCPSocket.Port)
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.ports[cp.ContainerPort]), time.Second)
		if err == nil {
			conn.Close()
		}
		return err
	}
	return fmt.Errorf("probe kind not emulated")
}

// waitReady waits until every probe of every running container passes.
func (c *cluster) waitReady(ctx context.Context) {
	for _, p := range c.pods {
		for _, ct := range allContainers(&p.wl.template.Spec) {
			for _, pr := range []*corev1.Probe{ct.StartupProbe, ct.ReadinessProbe, ct.LivenessProbe} {
				if pr == nil {
					continue
				}
				var err error
				for {
					if err = c.probe(p, ct, pr); err == nil || ctx.Err() != nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
				if err != nil {
					c.t.Errorf("pod %s container %s: probe never passed: %v", p.name, ct.Name, err)
				}
			}
		}
	}
}

// tlsFor is a client TLS config trusting the CA in a Secret's key, for a
// server name, as a ServiceMonitor's tlsConfig asks.
func tlsFor(t *testing.T, caFile, serverName string) *tls.Config {
	t.Helper()
	b, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("%s: no certificate", caFile)
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
}

// portOf is the loopback port of a pod's named or numbered port.
func (p *pod) portOf(port intstr.IntOrString) (int, bool) {
	cp, ok := containerPort(podPorts(&p.wl.template.Spec), port)
	if !ok {
		return 0, false
	}
	return p.ports[cp.ContainerPort], true
}

// TestClusterOnLoopback runs the eu overlay's pods on loopback with the
// Secrets certs.sh makes and a real Redis for the region's: three etcd
// members, three coordinators on them, the agent DaemonSet's pod and the
// gateway Deployment's pods with their sidecars. Every probe must pass,
// every declared TCP port must be listened on, every ServiceMonitor
// endpoint must serve metrics with its TLS settings, every agent must hold
// a live lease (mutual TLS to the coordinators) and see the region's other
// agents, every agent's allow API must refuse a caller without the
// gateway's token and serve it with it, a gateway must answer through its
// sidecar (TLS on 127.0.0.1, with its token), and every connection the
// arguments ask for must be allowed by the NetworkPolicies.
func TestClusterOnLoopback(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a dozen processes")
	}
	bin := binaries(t)
	need(t, "etcd", "etcd-server")
	m := render(t, "kubernetes/overlays/eu")
	secrets := certSecrets(t, "eu", m.namespace)
	redis := startRedis(t)
	c := newCluster(t, m, bin, secrets, map[string]string{"redis-eu": redis.Addr})
	if t.Failed() {
		return
	}
	c.start()
	// Every connection the arguments ask for is one the NetworkPolicies allow.
	for _, e := range c.edges {
		for _, np := range m.networkPolicies {
			if !labelSelects(t, &np.Spec.PodSelector, e.to.wl.template.Labels) {
				continue
			}
			allowed := false
			for _, rule := range np.Spec.Ingress {
				from := len(rule.From) == 0
				for _, peer := range rule.From {
					from = from || peer.PodSelector != nil && labelSelects(t, peer.PodSelector, e.from.wl.template.Labels)
				}
				port := len(rule.Ports) == 0
				for _, rp := range rule.Ports {
					port = port || rp.Port != nil && (rp.Port.StrVal == e.port.Name || rp.Port.IntVal == e.port.ContainerPort)
				}
				allowed = allowed || from && port
			}
			if !allowed {
				t.Errorf("NetworkPolicy %s refuses %s → %s port %s, which %s's arguments use", np.Name, e.from.name, e.to.name, e.port.Name, e.from.wl.name)
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c.waitReady(ctx)
	if t.Failed() {
		return
	}

	for _, p := range c.pods {
		for _, cp := range podPorts(&p.wl.template.Spec) {
			if cp.Protocol == corev1.ProtocolUDP {
				continue
			}
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.ports[cp.ContainerPort]), time.Second)
			if err != nil {
				t.Errorf("pod %s: containerPort %d (%s) is not listened on: %v", p.name, cp.ContainerPort, cp.Name, err)
				continue
			}
			conn.Close()
		}
	}

	for _, sm := range m.serviceMonitors {
		for _, s := range m.services {
			if !labelSelects(t, &sm.Spec.Selector, s.Labels) {
				continue
			}
			for _, ep := range sm.Spec.Endpoints {
				i := slices.IndexFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port })
				client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{}}
				scheme := "http"
				if ep.Scheme != nil && strings.EqualFold(ep.Scheme.String(), "https") {
					scheme = "https"
					tc := ep.TLSConfig
					client.Transport = &http.Transport{TLSClientConfig: tlsFor(t, filepath.Join(secrets[tc.CA.Secret.Name], tc.CA.Secret.Key), ptrOr(tc.ServerName, ""))}
				}
				for _, p := range c.pods {
					if !selects(s.Spec.Selector, p.wl.template.Labels) {
						continue
					}
					port, _ := p.portOf(s.Spec.Ports[i].TargetPort)
					url := fmt.Sprintf("%s://127.0.0.1:%d%s", scheme, port, ep.Path)
					res, err := client.Get(url)
					if err != nil {
						t.Errorf("ServiceMonitor %s, pod %s: %v", sm.Name, p.name, err)
						continue
					}
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if res.StatusCode != 200 || !bytes.Contains(b, []byte("\nallot_")) {
						t.Errorf("ServiceMonitor %s, pod %s: %s: %d, %d bytes, no allot_ metric", sm.Name, p.name, url, res.StatusCode, len(b))
					}
				}
			}
		}
	}

	// Every agent leases over mutual TLS and sees the region's others, and
	// its allow API takes only listed callers.
	type agentStatus struct {
		LeaseLive       bool     `json:"lease_live"`
		Members         []string `json:"members"`
		CoordinatorAuth string   `json:"coordinator_auth"`
		AllowAuth       string   `json:"allow_auth"`
	}
	var agents []string
	for _, p := range c.pods {
		for _, ct := range allContainers(&p.wl.template.Spec) {
			if filepath.Base(ct.Command[0]) == "agent" {
				port, _ := p.portOf(ct.ReadinessProbe.HTTPGet.Port)
				agents = append(agents, fmt.Sprintf("https://127.0.0.1:%d/status", port))
			}
		}
	}
	if len(agents) != 3 {
		t.Errorf("%d agents, want the DaemonSet's one and two sidecars", len(agents))
	}
	for _, url := range agents {
		var st agentStatus
		var err error
		for {
			st = agentStatus{}
			err = getJSON(probeClient, url, &st)
			if err == nil && st.LeaseLive && len(st.Members) == len(agents) || ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil || !st.LeaseLive || len(st.Members) != len(agents) {
			t.Errorf("%s: lease live %v, members %v (want %d), err %v", url, st.LeaseLive, st.Members, len(agents), err)
		}
		if st.CoordinatorAuth != "mtls" || st.AllowAuth != "token" {
			t.Errorf("%s: coordinator_auth %q, allow_auth %q; want mtls and token", url, st.CoordinatorAuth, st.AllowAuth)
		}
	}

	// The allow API, reachable from the cluster on every agent's HTTP port,
	// refuses a caller without a listed token and serves the gateway's.
	token, err := os.ReadFile(filepath.Join(secrets["allot-allow-tokens"], "gateway.token"))
	if err != nil {
		t.Fatal(err)
	}
	for _, status := range agents {
		url := strings.TrimSuffix(status, "/status") + "/v1/allow"
		for _, tc := range []struct {
			token string
			want  int
		}{{"", http.StatusUnauthorized}, {"not-the-gateway-0123456789", http.StatusUnauthorized}, {strings.TrimSpace(string(token)), http.StatusOK}} {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"subject":"acme","plan":"free","descriptor":[{"key":"path","value":"/items"}]}`))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			res, err := probeClient.Do(req)
			if err != nil {
				t.Errorf("%s: %v", url, err)
				continue
			}
			res.Body.Close()
			if res.StatusCode != tc.want {
				t.Errorf("%s with token %q: %d, want %d", url, tc.token, res.StatusCode, tc.want)
			}
		}
	}

	// A gateway answers from its sidecar's decisions, which take its token
	// (refused, they would be 503s: the limiter unavailable to it).
	for _, p := range c.podsOf("allot-gateway") {
		port, _ := p.portOf(intstr.FromString("http"))
		req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/items", port), nil)
		req.Header.Set("X-Tenant", "acme-"+p.name)
		req.Header.Set("X-Plan", "free")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("gateway %s: %v", p.name, err)
			continue
		}
		res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("RateLimit-Policy") == "" {
			t.Errorf("gateway %s: /items: %d, RateLimit-Policy %q; want 200 with the policy", p.name, res.StatusCode, res.Header.Get("RateLimit-Policy"))
		}
	}
}

func getJSON(client *http.Client, url string, v any) error {
	res, err := client.Get(url)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != 200 {
		return fmt.Errorf("%s: %d", url, res.StatusCode)
	}
	return json.NewDecoder(res.Body).Decode(v)
}
