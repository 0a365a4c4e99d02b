// Package deploy holds the tests of allot's deployment artifacts: the
// Dockerfile at the repository's root, the Kubernetes manifests
// (kubernetes/), the systemd units (systemd/), the Grafana dashboard
// (grafana/) and the Prometheus alerting rules (prometheus/).
//
// It is a module of its own so that the Kubernetes and Prometheus types it
// decodes into stay out of the main module. The tests build the binaries
// with the Dockerfile's own build command, then run them: every flag the
// artifacts pass must exist, every port must be listened on, every probe
// path must answer, and every dashboard query and alert must find data in
// a real Prometheus scraping real processes.
package deploy
