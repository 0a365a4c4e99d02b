package chaos

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
)

// Owners attributes a proxied connection to the process that opened it, so
// one proxy in front of a server can treat each client (an agent, a
// sentinel) on its own. The client's socket is found in /proc/net/tcp by
// its two addresses, and its inode among the file descriptors of the
// processes the harness started. This is Linux only, as the harness is.
// Owners is safe for concurrent use.
type Owners struct {
	mu   sync.Mutex
	pids map[int]string
}

// NewOwners returns an empty registry.
func NewOwners() *Owners { return &Owners{pids: map[int]string{}} }

// Set names the party of process pid.
func (o *Owners) Set(pid int, party string) {
	o.mu.Lock()
	o.pids[pid] = party
	o.mu.Unlock()
}

// Forget drops process pid.
func (o *Owners) Forget(pid int) {
	o.mu.Lock()
	delete(o.pids, pid)
	o.mu.Unlock()
}

// Of returns the party of the process at the other end of c (accepted by
// the proxy), or "" when it is none of the registered processes.
func (o *Owners) Of(c net.Conn) string {
	peer, ok1 := c.RemoteAddr().(*net.TCPAddr)
	local, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok1 || !ok2 {
		return ""
	}
	inode, err := socketInode(peer, local)
	if err != nil || inode == "" {
		return ""
	}
	want := "socket:[" + inode + "]"
	o.mu.Lock()
	pids := make(map[int]string, len(o.pids))
	for p, n := range o.pids {
		pids[p] = n
	}
	o.mu.Unlock()
	for pid, party := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && l == want {
				return party
			}
		}
	}
	return ""
}

// socketInode finds the inode of the IPv4 socket whose local address is
// laddr and whose peer is raddr.
func socketInode(laddr, raddr *net.TCPAddr) (string, error) {
	l, r := procAddr(laddr), procAddr(raddr)
	if l == "" || r == "" {
		return "", nil
	}
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
		if len(fs) >= 10 && fs[1] == l && fs[2] == r {
			return fs[9], nil
		}
	}
	return "", sc.Err()
}

// procAddr writes an IPv4 address as /proc/net/tcp does: the address as a
// little-endian 32-bit word in hex, a colon, the port in hex.
func procAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	if ip == nil {
		return ""
	}
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
}

// pidParty is a process id and its party, for logs.
func pidParty(pid int, party string) string { return party + "(" + strconv.Itoa(pid) + ")" }
