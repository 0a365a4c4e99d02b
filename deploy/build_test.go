package deploy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// repoRoot is the main module, the Docker build's context.
var repoRoot = func() string {
	p, err := filepath.Abs("..")
	if err != nil {
		panic(err)
	}
	return p
}()

// imageBinaries are the binaries the image ships, in the order the tests
// refer to them.
var imageBinaries = []string{"coordinator", "agent", "gateway", "sim"}

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// binaries returns the directory holding the image's binaries, built once
// per test binary by running the Dockerfile's build stage here (its
// output directory moved to a temporary one), so that every other test
// runs exactly what the image would hold.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "allot-image-")
		if buildErr != nil {
			return
		}
		buildErr = runBuildStage(binDir)
	})
	if buildErr != nil {
		t.Fatalf("the Dockerfile's build stage: %v", buildErr)
	}
	return binDir
}

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// runBuildStage runs the RUN commands of the Dockerfile's first stage in
// the build context, with its output directory /out replaced by out.
func runBuildStage(out string) error {
	df, err := parseDockerfile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		return err
	}
	for _, in := range df.stages[0].instrs {
		if in.cmd != "RUN" {
			continue
		}
		script := strings.ReplaceAll(in.args, "/out/", out+"/")
		cmd := exec.Command("sh", "-ec", script)
		cmd.Dir = repoRoot
		if b, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("Dockerfile:%d: RUN %s: %w\n%s", in.line, in.args, err, b)
		}
	}
	return nil
}

// dockerfile is a parsed Dockerfile: global ARGs and the stages.
type dockerfile struct {
	args   map[string]string
	stages []stage
}

type stage struct {
	from, name string
	line       int
	instrs     []instruction
}

// instruction is one instruction, continuation lines joined; flags are
// its --name=value options (COPY --from=build).
type instruction struct {
	cmd   string
	flags map[string]string
	args  string
	line  int
}

// parseDockerfile reads the subset of the Dockerfile syntax this project
// uses: comments, line continuations, ARG, FROM ... AS, and instructions
// with --flag=value options. Anything else is an error, so the test
// cannot silently skip what it does not understand.
func parseDockerfile(path string) (*dockerfile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	df := &dockerfile{args: map[string]string{}}
	sc := bufio.NewScanner(bytes.NewReader(data))
	var cur strings.Builder
	start, n := 0, 0
	known := map[string]bool{"ARG": true, "FROM": true, "WORKDIR": true, "COPY": true, "RUN": true, "ENV": true,
		"USER": true, "EXPOSE": true, "ENTRYPOINT": true, "CMD": true, "LABEL": true}
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(line)
		text := cur.String()
		cur.Reset()
		cmd, rest, _ := strings.Cut(text, " ")
		cmd = strings.ToUpper(cmd)
		if !known[cmd] {
			return nil, fmt.Errorf("%s:%d: instruction %s not understood by this test", path, start, cmd)
		}
		in := instruction{cmd: cmd, flags: map[string]string{}, line: start}
		rest = strings.TrimSpace(rest)
		for strings.HasPrefix(rest, "--") {
			var f string
			f, rest, _ = strings.Cut(rest, " ")
			k, v, _ := strings.Cut(strings.TrimPrefix(f, "--"), "=")
			in.flags[k] = v
			rest = strings.TrimSpace(rest)
		}
		in.args = rest
		switch {
		case cmd == "ARG" && len(df.stages) == 0:
			k, v, _ := strings.Cut(rest, "=")
			df.args[k] = v
		case cmd == "FROM":
			f := strings.Fields(rest)
			s := stage{from: os.Expand(f[0], func(k string) string { return df.args[k] }), line: start}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			} else if len(f) != 1 {
				return nil, fmt.Errorf("%s:%d: FROM %s not understood", path, start, rest)
			}
			df.stages = append(df.stages, s)
		case len(df.stages) == 0:
			return nil, fmt.Errorf("%s:%d: %s before the first FROM", path, start, cmd)
		default:
			s := &df.stages[len(df.stages)-1]
			s.instrs = append(s.instrs, in)
		}
	}
	return df, sc.Err()
}

// helpFlagRE finds the flags in a Go flag set's usage ("  -name type").
var helpFlagRE = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9_.-]*)`)

// flagsOf runs argv with -h and returns the flags its usage lists, and the
// usage text.
func flagsOf(t *testing.T, argv ...string) (map[string]bool, string) {
	t.Helper()
	cmd := exec.Command(argv[0], append(argv[1:], "-h")...)
	b, _ := cmd.CombinedOutput() // -h exits 0 or 2 depending on the flag set's mode
	flags := map[string]bool{}
	for _, m := range helpFlagRE.FindAllStringSubmatch(string(b), -1) {
		flags[m[1]] = true
	}
	if len(flags) == 0 {
		t.Fatalf("%v -h lists no flags:\n%s", argv, b)
	}
	return flags, string(b)
}
