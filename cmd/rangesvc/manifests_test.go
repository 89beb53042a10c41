package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.etcd.io/etcd/server/v3/embed"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/idrange/idrange/internal/testing/testpki"
	"github.com/idrange/idrange/internal/tools/promrule"
)

// The Kubernetes manifests of deploy/kubernetes (docs/operations/deploy.md,
// "Container image and Kubernetes") are decoded strictly into the API types
// (k8s.io/api; an unknown or duplicate field fails), the rangesvc container's
// arguments and its ConfigMap's --config file run through serve's own flag
// parser and validation with the mounted secrets in place, and the etcd
// StatefulSet's arguments through the flag set of the etcd server library
// idrange builds against. A renamed flag, a misspelt field or a path outside
// the mounts fails the test.

const manifestDir = "../../deploy/kubernetes"

// serviceMonitor is the Prometheus Operator's ServiceMonitor
// (monitoring.coreos.com/v1), reduced to the fields the manifests use, with
// the CRD's field names, so strict decoding rejects anything else. (The
// Operator's API module would bring controller-runtime and apiextensions.)
type serviceMonitor struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		JobLabel          string               `json:"jobLabel,omitempty"`
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector"`
		Endpoints []smEndpoint `json:"endpoints"`
	} `json:"spec"`
}

type smEndpoint struct {
	Port          string `json:"port,omitempty"`
	Path          string `json:"path,omitempty"`
	Scheme        string `json:"scheme,omitempty"`
	Interval      string `json:"interval,omitempty"`
	ScrapeTimeout string `json:"scrapeTimeout,omitempty"`
	TLSConfig     *struct {
		ServerName         string                    `json:"serverName,omitempty"`
		InsecureSkipVerify bool                      `json:"insecureSkipVerify,omitempty"`
		CA                 *smSecretOrConfigMap      `json:"ca,omitempty"`
		Cert               *smSecretOrConfigMap      `json:"cert,omitempty"`
		KeySecret          *corev1.SecretKeySelector `json:"keySecret,omitempty"`
	} `json:"tlsConfig,omitempty"`
}

type smSecretOrConfigMap struct {
	Secret    *corev1.SecretKeySelector    `json:"secret,omitempty"`
	ConfigMap *corev1.ConfigMapKeySelector `json:"configMap,omitempty"`
}

// manifests is every object of deploy/kubernetes by kind and name.
type manifests struct {
	raw             map[string][]byte // file name -> content
	namespaces      map[string]*corev1.Namespace
	configMaps      map[string]*corev1.ConfigMap
	services        map[string]*corev1.Service
	deployments     map[string]*appsv1.Deployment
	statefulSets    map[string]*appsv1.StatefulSet
	pdbs            map[string]*policyv1.PodDisruptionBudget
	serviceMonitors map[string]*serviceMonitor
	prometheusRules map[string]*promrule.PrometheusRule
}

var (
	docSep      = regexp.MustCompile(`(?m)^---[ \t]*$`)
	commentLine = regexp.MustCompile(`(?m)^\s*#.*$`)
)

// decodeManifests decodes every document of every file strictly; kinds
// other than the ones listed are refused.
func decodeManifests(files map[string][]byte) (*manifests, error) {
	m := &manifests{
		raw:             files,
		namespaces:      map[string]*corev1.Namespace{},
		configMaps:      map[string]*corev1.ConfigMap{},
		services:        map[string]*corev1.Service{},
		deployments:     map[string]*appsv1.Deployment{},
		statefulSets:    map[string]*appsv1.StatefulSet{},
		pdbs:            map[string]*policyv1.PodDisruptionBudget{},
		serviceMonitors: map[string]*serviceMonitor{},
		prometheusRules: map[string]*promrule.PrometheusRule{},
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, file := range names {
		for i, doc := range docSep.Split(string(files[file]), -1) {
			if err := m.decode([]byte(doc)); err != nil {
				return nil, fmt.Errorf("%s document %d: %w", file, i+1, err)
			}
		}
	}
	return m, nil
}

func (m *manifests) decode(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	if tm.APIVersion == "" && tm.Kind == "" {
		if strings.TrimSpace(commentLine.ReplaceAllString(string(doc), "")) == "" {
			return nil // comments only
		}
		return errors.New("no apiVersion and kind")
	}
	var name, ns string
	strict := func(o any) error { return promrule.DecodeStrict(doc, o) } // as the API server decodes
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Namespace":
		o := &corev1.Namespace{}
		if err := strict(o); err != nil {
			return err
		}
		m.namespaces[o.Name] = o
		return nil
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		if err := strict(o); err != nil {
			return err
		}
		name, ns = o.Name, o.Namespace
		m.configMaps[name] = o
	case "v1 Service":
		o := &corev1.Service{}
		if err := strict(o); err != nil {
			return err
		}
		name, ns = o.Name, o.Namespace
		m.services[name] = o
	case "apps/v1 Deployment":
		o := &appsv1.Deployment{}
		if err := strict(o); err != nil {
			return err
		}
		name, ns = o.Name, o.Namespace
		m.deployments[name] = o
	case "apps/v1 StatefulSet":
		o := &appsv1.StatefulSet{}
		if err := strict(o); err != nil {
			return err
		}
		name, ns = o.Name, o.Namespace
		m.statefulSets[name] = o
	case "policy/v1 PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		if err := strict(o); err != nil {
			return err
		}
		name, ns = o.Name, o.Namespace
		m.pdbs[name] = o
	case "monitoring.coreos.com/v1 ServiceMonitor":
		o := &serviceMonitor{}
		if err := strict(o); err != nil {
			return err
		}
		name, ns = o.Metadata.Name, o.Metadata.Namespace
		m.serviceMonitors[name] = o
	case "monitoring.coreos.com/v1 PrometheusRule":
		o := &promrule.PrometheusRule{}
		if err := strict(o); err != nil {
			return err
		}
		name, ns = o.Metadata.Name, o.Metadata.Namespace
		m.prometheusRules[name] = o
	default:
		return fmt.Errorf("kind %q of %q is not one the test knows", tm.Kind, tm.APIVersion)
	}
	if name == "" || ns == "" {
		return fmt.Errorf("%s without a name or namespace", tm.Kind)
	}
	return nil
}

func readManifests(t *testing.T) *manifests {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no manifests in %s: %v", manifestDir, err)
	}
	files := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files[filepath.Base(p)] = b
	}
	m, err := decodeManifests(files)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func need[T any](t *testing.T, objs map[string]T, kind, name string) T {
	t.Helper()
	o, ok := objs[name]
	if !ok {
		t.Fatalf("no %s %q in %s", kind, name, manifestDir)
	}
	return o
}

func containerNamed(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

// serveConfig runs the rangesvc container's args, with its ConfigMap and
// secrets mounted in a temporary directory (secrets hold a test PKI's
// files, by key: ca.crt, tls.crt, tls.key), through parseServeFlags. edit,
// if not nil, changes the args and the ConfigMap data first.
func (m *manifests) serveConfig(t *testing.T, edit func(args []string, cm map[string]string) []string) (serveConfig, error) {
	t.Helper()
	d := need(t, m.deployments, "Deployment", "rangesvc")
	spec := &d.Spec.Template.Spec
	c := containerNamed(t, spec, "rangesvc")
	if len(c.Command) > 0 {
		t.Fatalf("container rangesvc sets command %q: the image's entrypoint is rangesvc; give args only", c.Command)
	}
	ca, err := testpki.NewCA("manifest test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Server("rangesvc.idrange.svc")
	if err != nil {
		t.Fatal(err)
	}
	secretFile := map[string][]byte{"ca.crt": ca.PEM, "tls.crt": leaf.CertPEM, "tls.key": leaf.KeyPEM}

	args := slices.Clone(c.Args)
	edited := map[string]map[string]string{} // ConfigMap name -> data
	for name, cm := range m.configMaps {
		edited[name] = map[string]string{}
		for k, v := range cm.Data {
			edited[name][k] = v
		}
	}
	if edit != nil {
		for _, data := range edited {
			args = edit(args, data)
		}
	}

	vols := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		vols[v.Name] = v
	}
	root := t.TempDir()
	var repl []string
	for _, vm := range c.VolumeMounts {
		v, ok := vols[vm.Name]
		if !ok {
			t.Fatalf("volume mount %q has no volume", vm.Name)
		}
		dir := filepath.Join(root, vm.Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		write := func(path string, b []byte) {
			if err := os.WriteFile(filepath.Join(dir, path), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		switch {
		case v.ConfigMap != nil:
			data, ok := edited[v.ConfigMap.Name]
			if !ok {
				t.Fatalf("volume %q: no ConfigMap %q", v.Name, v.ConfigMap.Name)
			}
			for _, it := range v.ConfigMap.Items {
				body, ok := data[it.Key]
				if !ok {
					t.Fatalf("volume %q: ConfigMap %q has no key %q", v.Name, v.ConfigMap.Name, it.Key)
				}
				write(it.Path, []byte(body))
			}
		case v.Secret != nil:
			if len(v.Secret.Items) == 0 {
				t.Fatalf("secret volume %q lists no items: list them, so the files the flags name are explicit", v.Name)
			}
			for _, it := range v.Secret.Items {
				body, ok := secretFile[it.Key]
				if !ok {
					t.Fatalf("secret volume %q: key %q is none of ca.crt, tls.crt, tls.key", v.Name, it.Key)
				}
				write(it.Path, body)
			}
		case v.EmptyDir != nil:
		default:
			t.Fatalf("volume %q: a kind the test does not know", v.Name)
		}
		repl = append(repl, strings.TrimSuffix(vm.MountPath, "/")+"/", dir+"/")
	}
	// Paths in the args and the config file point into the temporary mounts.
	r := strings.NewReplacer(repl...)
	for i := range args {
		args[i] = r.Replace(args[i])
	}
	for _, v := range spec.Volumes {
		if v.ConfigMap == nil {
			continue
		}
		for _, it := range v.ConfigMap.Items {
			p := filepath.Join(root, v.Name, it.Path)
			b, err := os.ReadFile(p)
			if err != nil {
				continue // not mounted by this container
			}
			if err := os.WriteFile(p, []byte(r.Replace(string(b))), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(args) == 0 || args[0] != "serve" {
		t.Fatalf("container rangesvc args %q: want serve ...", c.Args)
	}
	var stderr strings.Builder
	cfg, err := parseServeFlags(args[1:], &stderr)
	if err != nil {
		return cfg, fmt.Errorf("%w (stderr %q)", err, stderr.String())
	}
	return cfg, nil
}

// portOf returns the port number of a host:port flag value and checks that
// it listens on every interface (the pod IP is what Services publish).
func portOf(t *testing.T, flag, addr string) int32 {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s %q: %v", flag, addr, err)
	}
	if host != "" && host != "0.0.0.0" && host != "::" {
		t.Errorf("%s %q listens on %q only; in a pod it must listen on all interfaces", flag, addr, host)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		t.Fatalf("%s %q: want a fixed port", flag, addr)
	}
	return int32(p)
}

// containerPort resolves a probe's or Service's port (a name or a number)
// to the container's port number.
func containerPort(t *testing.T, c *corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %q has no port named %q", c.Name, p.StrVal)
	return 0
}

func fmtPtr[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}

func selects(t *testing.T, sel *metav1.LabelSelector, podLabels map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatal(err)
	}
	return !s.Empty() && s.Matches(labels.Set(podLabels))
}

func TestKubernetesManifests(t *testing.T) {
	m := readManifests(t)
	ns := need(t, m.namespaces, "Namespace", "idrange")
	for file, b := range m.raw {
		if !strings.Contains(string(b), "kind: Namespace") && !strings.Contains(string(b), "namespace: "+ns.Name) {
			t.Errorf("%s: objects not in namespace %q", file, ns.Name)
		}
	}

	cfg, err := m.serveConfig(t, nil)
	if err != nil {
		t.Fatalf("the rangesvc container's args and --config file do not parse: %v", err)
	}
	d := need(t, m.deployments, "Deployment", "rangesvc")
	pod := &d.Spec.Template
	c := containerNamed(t, &pod.Spec, "rangesvc")

	t.Run("ConfigFile", func(t *testing.T) {
		switch {
		case cfg.ConfigFile == "":
			t.Error("the flags do not come from a --config file (ConfigMap)")
		case cfg.Security.TLSCert == "" || cfg.Security.TLSClientCA == "":
			t.Error("the gRPC port does not serve mutual TLS (--tls-cert, --tls-key, --tls-client-ca)")
		case cfg.Security.Insecure:
			t.Error("--insecure is set")
		case cfg.Security.MetricsClientCA != "":
			t.Error("--metrics-client-ca is set: kubelet's probes carry no client certificate")
		case len(cfg.Etcd) == 0:
			t.Error("no --etcd: a Deployment's replicas must share an external etcd")
		}
	})

	t.Run("Deployment", func(t *testing.T) {
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
			t.Errorf("replicas = %v; want 3", d.Spec.Replicas)
		}
		if !selects(t, d.Spec.Selector, pod.Labels) {
			t.Errorf("selector %v does not select the pod template's labels %v", d.Spec.Selector, pod.Labels)
		}
		spread := false
		for _, tsc := range pod.Spec.TopologySpreadConstraints {
			spread = spread || (tsc.TopologyKey == corev1.LabelHostname && tsc.WhenUnsatisfiable == corev1.DoNotSchedule &&
				tsc.MaxSkew == 1 && selects(t, tsc.LabelSelector, pod.Labels))
		}
		if a := pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
			for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
				spread = spread || (term.TopologyKey == corev1.LabelHostname && selects(t, term.LabelSelector, pod.Labels))
			}
		}
		if !spread {
			t.Error("replicas are not spread across nodes (topologySpreadConstraints or podAntiAffinity on kubernetes.io/hostname)")
		}
		grace := pod.Spec.TerminationGracePeriodSeconds
		if drain := cfg.DrainDelay + cfg.ShutdownTimeout; grace == nil || float64(*grace) <= drain.Seconds() {
			t.Errorf("terminationGracePeriodSeconds (%s) is not above --drain-delay + --shutdown-timeout (%v)", fmtPtr(grace), drain)
		}

		ports := map[string]int32{"grpc": portOf(t, "--listen", cfg.Listen), "metrics": portOf(t, "--metrics", cfg.Metrics)}
		if cfg.HTTP != "" {
			ports["http"] = portOf(t, "--http", cfg.HTTP)
		}
		for name, want := range ports {
			if got := containerPort(t, c, intstr.FromString(name)); got != want {
				t.Errorf("container port %q = %d; the flags listen on %d", name, got, want)
			}
		}
		scheme := corev1.URISchemeHTTP
		if cfg.Security.TLSCert != "" {
			scheme = corev1.URISchemeHTTPS
		}
		for _, p := range []struct {
			name  string
			probe *corev1.Probe
			path  string
		}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/livez"}} {
			switch {
			case p.probe == nil || p.probe.HTTPGet == nil:
				t.Errorf("no HTTP %s probe", p.name)
			case p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Scheme != scheme ||
				containerPort(t, c, p.probe.HTTPGet.Port) != ports["metrics"]:
				t.Errorf("%s probe %+v; want %s %s on the --metrics port %d", p.name, p.probe.HTTPGet, scheme, p.path, ports["metrics"])
			}
		}

		sc, psc := c.SecurityContext, pod.Spec.SecurityContext
		if sc == nil || psc == nil {
			t.Fatal("no pod or container securityContext")
		}
		uid := psc.RunAsUser
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		nonRoot := (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot) || (sc.RunAsNonRoot == nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot)
		switch {
		case !nonRoot || uid == nil || *uid == 0:
			t.Error("the container may run as root (runAsNonRoot, a non-zero runAsUser)")
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
			t.Error("the root file system is writable")
		case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
			t.Error("allowPrivilegeEscalation is not false")
		case sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0:
			t.Error("capabilities are not all dropped")
		}
		req := c.Resources.Requests
		if req.Cpu().IsZero() || req.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
		}
	})

	t.Run("Service", func(t *testing.T) {
		svc := need(t, m.services, "Service", "rangesvc")
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("clusterIP %q: the dns:/// round-robin target needs a headless Service (clusterIP: None)", svc.Spec.ClusterIP)
		}
		if svc.Spec.PublishNotReadyAddresses {
			t.Error("publishNotReadyAddresses: clients would resolve replicas that are NOT_SERVING")
		}
		if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, pod.Labels) {
			t.Errorf("selector %v does not select the rangesvc pods %v", svc.Spec.Selector, pod.Labels)
		}
		names := map[string]bool{}
		for _, p := range svc.Spec.Ports {
			names[p.Name] = true
			if got := containerPort(t, c, p.TargetPort); got != p.Port {
				t.Errorf("Service port %q %d targets container port %d: headless Services publish pod IPs, so clients dial the container port", p.Name, p.Port, got)
			}
		}
		if !names["grpc"] || !names["metrics"] {
			t.Errorf("Service ports %v: want grpc and metrics", names)
		}
	})

	t.Run("PodDisruptionBudget", func(t *testing.T) {
		for name, set := range map[string]*corev1.PodTemplateSpec{"rangesvc": pod, "etcd": &need(t, m.statefulSets, "StatefulSet", "etcd").Spec.Template} {
			pdb := need(t, m.pdbs, "PodDisruptionBudget", name)
			if !selects(t, pdb.Spec.Selector, set.Labels) {
				t.Errorf("PDB %q selector %v does not select its pods %v", name, pdb.Spec.Selector, set.Labels)
			}
			if mu := pdb.Spec.MaxUnavailable; mu == nil || mu.Type != intstr.Int || mu.IntVal != 1 {
				t.Errorf("PDB %q maxUnavailable %v; want 1", name, mu)
			}
		}
	})

	t.Run("Etcd", func(t *testing.T) { checkEtcd(t, m, cfg) })

	t.Run("ServiceMonitor", func(t *testing.T) {
		sm := need(t, m.serviceMonitors, "ServiceMonitor", "rangesvc")
		svc := need(t, m.services, "Service", "rangesvc")
		if !selects(t, &sm.Spec.Selector, svc.Labels) || !slices.Contains(sm.Spec.NamespaceSelector.MatchNames, svc.Namespace) {
			t.Errorf("ServiceMonitor selects %v in %v; the Service has labels %v in %q",
				sm.Spec.Selector, sm.Spec.NamespaceSelector.MatchNames, svc.Labels, svc.Namespace)
		}
		if len(sm.Spec.Endpoints) == 0 {
			t.Fatal("no endpoints")
		}
		for _, e := range sm.Spec.Endpoints {
			found := false
			for _, p := range svc.Spec.Ports {
				found = found || (p.Name == e.Port && containerPort(t, c, p.TargetPort) == portOf(t, "--metrics", cfg.Metrics))
			}
			if !found || e.Path != "/metrics" {
				t.Errorf("endpoint %+v does not scrape the Service's metrics port at /metrics", e)
			}
			if tls := cfg.Security.TLSCert != ""; tls != (e.Scheme == "https") || (tls && (e.TLSConfig == nil || e.TLSConfig.CA == nil)) {
				t.Errorf("endpoint scheme %q, TLS config %+v; the metrics port serves TLS: %v", e.Scheme, e.TLSConfig, tls)
			}
		}
	})

	t.Run("PrometheusRule", func(t *testing.T) {
		pr := need(t, m.prometheusRules, "PrometheusRule", promrule.Name)
		if len(pr.Spec.Groups) == 0 {
			t.Error("PrometheusRule without groups")
		}
	})
}

// etcdFlagSet is etcd's own flag set (go.etcd.io/etcd/server/v3/embed),
// plus the flags etcdmain adds to it.
func etcdFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	embed.NewConfig().AddFlags(fs)
	fs.String("initial-cluster-state", "new", "")
	fs.String("config-file", "", "")
	return fs
}

// parseEtcdArgs parses a member's arguments, $(POD_NAME) expanded.
func parseEtcdArgs(args []string, podName string) (*flag.FlagSet, error) {
	fs := etcdFlagSet()
	expanded := make([]string, len(args))
	for i, a := range args {
		expanded[i] = strings.ReplaceAll(a, "$(POD_NAME)", podName)
	}
	if err := fs.Parse(expanded); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("etcd: stray arguments %q", fs.Args())
	}
	return fs, nil
}

func checkEtcd(t *testing.T, m *manifests, cfg serveConfig) {
	sts := need(t, m.statefulSets, "StatefulSet", "etcd")
	svc := need(t, m.services, "Service", sts.Spec.ServiceName)
	pod := &sts.Spec.Template
	c := containerNamed(t, &pod.Spec, "etcd")
	n := 0
	if sts.Spec.Replicas != nil {
		n = int(*sts.Spec.Replicas)
	}
	switch {
	case n != 3:
		t.Errorf("etcd replicas %d; want 3", n)
	case sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement:
		t.Error("podManagementPolicy is not Parallel: a new cluster's first member is not ready before a quorum starts")
	case svc.Spec.ClusterIP != corev1.ClusterIPNone || !svc.Spec.PublishNotReadyAddresses:
		t.Error("etcd's Service must be headless and publish not-ready members (peers resolve each other before they are ready)")
	case !selects(t, sts.Spec.Selector, pod.Labels) || !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, pod.Labels):
		t.Error("the StatefulSet's or the Service's selector does not select etcd's pods")
	}
	if !strings.HasPrefix(c.Image, "gcr.io/etcd-development/etcd:") && !strings.HasPrefix(c.Image, "quay.io/coreos/etcd:") {
		t.Errorf("etcd image %q is not the official one", c.Image)
	}

	// Files the flags name must be in a mounted secret.
	mounted := map[string]bool{}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Spec.Volumes {
		vols[v.Name] = v
	}
	for _, vm := range c.VolumeMounts {
		if v, ok := vols[vm.Name]; ok && v.Secret != nil {
			for _, it := range v.Secret.Items {
				mounted[filepath.Join(vm.MountPath, it.Path)] = true
			}
		}
	}
	var clientURLs []string
	for i := range n {
		member := fmt.Sprintf("%s-%d", sts.Name, i)
		host := fmt.Sprintf("%s.%s.%s.svc", member, svc.Name, sts.Namespace)
		fs, err := parseEtcdArgs(c.Args, member)
		if err != nil {
			t.Fatalf("etcd member %s: its arguments do not parse with etcd's flags: %v", member, err)
		}
		get := func(name string) string { return fs.Lookup(name).Value.String() }
		if get("name") != member {
			t.Errorf("member %s: --name %q", member, get("name"))
		}
		if want := "https://" + host + ":2380"; get("initial-advertise-peer-urls") != want {
			t.Errorf("member %s: --initial-advertise-peer-urls %q; want %q", member, get("initial-advertise-peer-urls"), want)
		}
		var cluster []string
		for j := range n {
			cluster = append(cluster, fmt.Sprintf("%s-%d=https://%s-%d.%s.%s.svc:2380", sts.Name, j, sts.Name, j, svc.Name, sts.Namespace))
		}
		if got := get("initial-cluster"); got != strings.Join(cluster, ",") {
			t.Errorf("--initial-cluster %q; want %q", got, strings.Join(cluster, ","))
		}
		clientURLs = append(clientURLs, get("advertise-client-urls"))
		for _, f := range []string{"client-cert-auth", "peer-client-cert-auth"} {
			if get(f) != "true" {
				t.Errorf("--%s is not true", f)
			}
		}
		for _, f := range []string{"trusted-ca-file", "cert-file", "key-file", "peer-trusted-ca-file", "peer-cert-file", "peer-key-file"} {
			if !mounted[get(f)] {
				t.Errorf("--%s %q is not a file of a mounted secret", f, get(f))
			}
		}
		if q, err := strconv.ParseInt(get("quota-backend-bytes"), 10, 64); err != nil || q != cfg.EtcdQuotaBytes {
			t.Errorf("etcd --quota-backend-bytes %q; rangesvc's --etcd-quota-bytes is %d", get("quota-backend-bytes"), cfg.EtcdQuotaBytes)
		}
	}
	if !slices.Equal(clientURLs, cfg.Etcd) {
		t.Errorf("rangesvc --etcd %q; the members advertise %q", cfg.Etcd, clientURLs)
	}
	var claim *corev1.PersistentVolumeClaim
	for i := range sts.Spec.VolumeClaimTemplates {
		claim = &sts.Spec.VolumeClaimTemplates[i]
	}
	if claim == nil {
		t.Fatal("no volumeClaimTemplates: etcd's data must be persistent")
	}
	if s := claim.Spec.Resources.Requests[corev1.ResourceStorage]; s.Cmp(*resource.NewQuantity(2*cfg.EtcdQuotaBytes, resource.BinarySI)) < 0 {
		t.Errorf("volume %s is less than twice the backend quota %d", s.String(), cfg.EtcdQuotaBytes)
	}
	found := false
	for _, vm := range c.VolumeMounts {
		found = found || vm.Name == claim.Name
	}
	if !found {
		t.Errorf("the claim %q is not mounted", claim.Name)
	}
}

// The test above can fail: an unknown field in any manifest, a renamed
// flag in the ConfigMap or the args, or a misspelt etcd flag each fail.
func TestKubernetesManifestsFailClosed(t *testing.T) {
	m := readManifests(t)
	for file, b := range m.raw {
		for _, where := range []struct{ name, old, new string }{
			{"top level", "\nmetadata:\n", "\nmetadataa: {}\nmetadata:\n"},
			{"metadata", "\nmetadata:\n", "\nmetadata:\n  nmae: x\n"},
		} {
			bad := strings.Replace(string(b), where.old, where.new, 1)
			if bad == string(b) {
				t.Fatalf("%s: no %q to edit", file, where.old)
			}
			_, err := decodeManifests(map[string][]byte{file: []byte(bad)})
			if err == nil || !strings.Contains(err.Error(), "unknown field") {
				t.Errorf("%s with an unknown field at %s: err %v; want unknown field", file, where.name, err)
			}
		}
	}
	bad := strings.Replace(string(m.raw["rangesvc-deployment.yaml"]), "readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true", 1)
	if _, err := decodeManifests(map[string][]byte{"d.yaml": []byte(bad)}); err == nil {
		t.Error("a misspelt nested field (readOnlyRootFileSystem) decoded")
	}

	for _, tc := range []struct {
		name string
		edit func(args []string, cm map[string]string) []string
		msg  string
	}{
		{"renamed key", func(a []string, cm map[string]string) []string {
			for k, v := range cm {
				cm[k] = strings.Replace(v, "\ndrain-delay:", "\ndrain-dalay:", 1)
			}
			return a
		}, `unknown key "drain-dalay"`},
		{"renamed arg", func(a []string, _ map[string]string) []string {
			return append(a, "--shutdown-timeoutt", "1s")
		}, "flag provided but not defined: -shutdown-timeoutt"},
		{"bad value", func(a []string, cm map[string]string) []string {
			for k, v := range cm {
				cm[k] = strings.Replace(v, "\nregion: 1\n", "\nregion: 4\n", 1)
			}
			return a
		}, "--region 4 not in 0..3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := m.serveConfig(t, tc.edit)
			if err == nil || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err %v; want %q", err, tc.msg)
			}
		})
	}

	args := need(t, m.statefulSets, "StatefulSet", "etcd").Spec.Template.Spec.Containers[0].Args
	badArgs := slices.Clone(args)
	for i, a := range badArgs {
		badArgs[i] = strings.Replace(a, "--quota-backend-bytes=", "--quota-backend-byte=", 1)
	}
	if _, err := parseEtcdArgs(args, "etcd-0"); err != nil {
		t.Fatalf("etcd args: %v", err)
	}
	if _, err := parseEtcdArgs(badArgs, "etcd-0"); err == nil || !strings.Contains(err.Error(), "quota-backend-byte") {
		t.Errorf("a misspelt etcd flag: err %v", err)
	}
}
