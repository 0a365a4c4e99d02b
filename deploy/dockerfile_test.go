package deploy

import (
	"bufio"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDockerfile checks the image without a container engine: a build
// stage and a final stage, the final one empty (scratch) or distroless,
// run as a non-root user that its /etc/passwd names, holding every binary
// on PATH; every COPY names something that exists (in the context and not
// excluded by .dockerignore, or made by the build stage); the Go image is
// at least the go.mod's version; the binaries are static.
func TestDockerfile(t *testing.T) {
	df, err := parseDockerfile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if len(df.stages) != 2 {
		t.Fatalf("%d stages, want a build stage and a final one", len(df.stages))
	}
	build, final := df.stages[0], df.stages[1]

	// The build stage: the Go image of the go.mod's version or later.
	m := regexp.MustCompile(`^golang:(\d+)\.(\d+)(?:\.(\d+))?-`).FindStringSubmatch(build.from)
	if m == nil {
		t.Fatalf("build stage FROM %s, want golang:<version>-<os>", build.from)
	}
	want := goDirective(t)
	if got := [3]int{atoi(m[1]), atoi(m[2]), atoi(m[3])}; compareVersions(got, want) < 0 {
		t.Errorf("build stage FROM %s: Go %v is older than go.mod's go %v", build.from, got, want)
	}
	var runs []string
	for _, in := range build.instrs {
		if in.cmd == "RUN" {
			runs = append(runs, in.args)
		}
	}
	if !strings.Contains(strings.Join(runs, "\n"), "CGO_ENABLED=0 go build") {
		t.Errorf("no RUN builds with CGO_ENABLED=0: %q", runs)
	}

	// The final stage: empty or distroless, non-root.
	if final.from != "scratch" && !strings.HasPrefix(final.from, "gcr.io/distroless/static") {
		t.Errorf("final stage FROM %s, want scratch or distroless static", final.from)
	}
	var user string
	var path []string
	copied := map[string]string{} // destination in the image → source
	ignored := dockerignore(t)
	bin := binaries(t)
	for _, in := range append(append([]instruction(nil), build.instrs...), final.instrs...) {
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENV":
			if v, ok := strings.CutPrefix(in.args, "PATH="); ok {
				path = strings.Split(v, ":")
			}
		case "COPY":
			f := strings.Fields(in.args)
			srcs, dst := f[:len(f)-1], f[len(f)-1]
			for _, src := range srcs {
				switch from := in.flags["from"]; {
				case from == "":
					if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
						t.Errorf("Dockerfile:%d: COPY %s: %v", in.line, src, err)
					} else if src != "." && ignored(src) {
						t.Errorf("Dockerfile:%d: COPY %s: excluded by .dockerignore", in.line, src)
					}
				case from != build.name:
					t.Errorf("Dockerfile:%d: COPY --from=%s: no such stage", in.line, from)
				case strings.HasPrefix(src, "/out/"):
					if _, err := os.Stat(filepath.Join(bin, strings.TrimPrefix(src, "/out/"))); err != nil {
						t.Errorf("Dockerfile:%d: COPY --from=%s %s: the build stage does not make it: %v", in.line, from, src, err)
					}
				default:
					// A file of the Go image's Debian base; this machine is
					// Debian too, and its file stands in.
					if _, err := os.Stat(src); err != nil {
						t.Errorf("Dockerfile:%d: COPY --from=%s %s: %v", in.line, from, src, err)
					}
				}
				d := dst
				if strings.HasSuffix(dst, "/") {
					d = dst + filepath.Base(src)
				}
				copied[d] = src
			}
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Errorf("USER %q: want a numeric non-root uid (Kubernetes' runAsNonRoot checks it)", user)
	}
	if src, ok := copied["/etc/passwd"]; !ok || !strings.HasPrefix(src, "/out/") {
		t.Errorf("/etc/passwd not copied from the build stage")
	} else if b, err := os.ReadFile(filepath.Join(bin, strings.TrimPrefix(src, "/out/"))); err != nil ||
		!regexp.MustCompile(`(?m)^[a-z]+:x:`+regexp.QuoteMeta(uid)+`:`).Match(b) {
		t.Errorf("/etc/passwd (%s) has no entry for uid %s: %q %v", src, uid, b, err)
	}
	for _, name := range imageBinaries {
		found := false
		for _, dir := range path {
			if _, ok := copied[dir+"/"+name]; ok {
				found = true
			}
		}
		if !found {
			t.Errorf("%s is not copied into a directory on the image's PATH %v", name, path)
		}
		f, err := elf.Open(filepath.Join(bin, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s has an ELF interpreter: dynamically linked", name)
			}
		}
		if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
			t.Errorf("%s needs shared libraries %v", name, libs)
		}
		f.Close()
	}

	// Every file the binaries are built from reaches the build.
	out, err := exec.Command("go", "list", "-C", repoRoot, "-deps", "-json=Dir,GoFiles,EmbedFiles,Module", "./cmd/coordinator", "./cmd/agent", "./cmd/gateway", "./cmd/sim").Output()
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	files := []string{"go.mod", "go.sum"}
	for dec.More() {
		var p struct {
			Dir                 string
			GoFiles, EmbedFiles []string
			Module              *struct{ Main bool }
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		rel, _ := filepath.Rel(repoRoot, p.Dir)
		for _, f := range append(p.GoFiles, p.EmbedFiles...) {
			files = append(files, filepath.Join(rel, f))
		}
	}
	if len(files) < 20 {
		t.Fatalf("go list found only %v", files)
	}
	for _, f := range files {
		if ignored(f) {
			t.Errorf(".dockerignore excludes %s, which the build needs", f)
		}
	}
}

// dockerignore returns whether .dockerignore excludes a context path. It
// reads the patterns this project uses (filepath.Match patterns, a
// directory excluding what it holds) and fails on exceptions (!) and **,
// which it does not implement.
func dockerignore(t *testing.T) func(string) bool {
	t.Helper()
	f, err := os.Open(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var pats []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasPrefix(l, "!") || strings.Contains(l, "**") {
			t.Fatalf(".dockerignore: %q: this test does not implement ! or **", l)
		}
		pats = append(pats, filepath.Clean(strings.TrimPrefix(l, "/")))
	}
	return func(p string) bool {
		for q := filepath.Clean(p); q != "." && q != "/"; q = filepath.Dir(q) {
			for _, pat := range pats {
				if ok, _ := filepath.Match(pat, q); ok {
					return true
				}
			}
		}
		return false
	}
}

// goDirective is the go.mod's go version.
func goDirective(t *testing.T) [3]int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\d+)\.(\d+)(?:\.(\d+))?$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	return [3]int{atoi(string(m[1])), atoi(string(m[2])), atoi(string(m[3]))}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func compareVersions(a, b [3]int) int {
	for i := range a {
		if a[i] != b[i] {
			return a[i] - b[i]
		}
	}
	return 0
}
