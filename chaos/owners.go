package chaos

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
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
	// seen maps socket inodes to parties, as of the last scan of the
	// processes' descriptors; a new connection's socket is a miss and
	// causes a rescan.
	seen map[string]string
}

// NewOwners returns an empty registry.
func NewOwners() *Owners { return &Owners{pids: map[int]string{}, seen: map[string]string{}} }

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
	o.seen = map[string]string{}
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
	o.mu.Lock()
	defer o.mu.Unlock()
	if party, ok := o.seen[inode]; ok {
		return party
	}
	seen := map[string]string{}
	for pid, party := range o.pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			if l, err := os.Readlink(dir + "/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:[") {
				seen[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = party
			}
		}
	}
	o.seen = seen
	return seen[inode]
}

// socketInode finds the inode of the IPv4 socket whose local address is
// laddr and whose peer is raddr: one sock_diag query to the kernel, or a
// scan of /proc/net/tcp when netlink is not available.
func socketInode(laddr, raddr *net.TCPAddr) (string, error) {
	if ino, err := diagInode(laddr, raddr); err == nil {
		return strconv.FormatUint(uint64(ino), 10), nil
	}
	return scanInode(laddr, raddr)
}

// diagInode asks the kernel (NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY with
// the exact socket id) for one TCP socket's inode.
func diagInode(laddr, raddr *net.TCPAddr) (uint32, error) {
	src, dst := laddr.IP.To4(), raddr.IP.To4()
	if src == nil || dst == nil {
		return 0, errors.New("chaos: not IPv4")
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, sockDiag)
	if err != nil {
		return 0, err
	}
	defer syscall.Close(fd)
	tv := syscall.Timeval{Sec: 1}
	_ = syscall.SetsockoptTimeval(fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv)
	// struct nlmsghdr (16 bytes) + struct inet_diag_req_v2 (56 bytes).
	req := make([]byte, 72)
	le := binary.LittleEndian // the host's order; amd64 and arm64 are little-endian
	le.PutUint32(req[0:], 72)
	le.PutUint16(req[4:], sockDiagByFamily)
	le.PutUint16(req[6:], syscall.NLM_F_REQUEST)
	le.PutUint32(req[8:], 1)
	req[16], req[17] = syscall.AF_INET, syscall.IPPROTO_TCP
	le.PutUint32(req[20:], 0xffffffff)                     // every state
	id := req[24:]                                         // struct inet_diag_sockid
	binary.BigEndian.PutUint16(id[0:], uint16(laddr.Port)) // #nosec G115 -- a TCP port, in [0, 65535]
	binary.BigEndian.PutUint16(id[2:], uint16(raddr.Port)) // #nosec G115 -- as above
	copy(id[4:8], src)
	copy(id[20:24], dst)
	le.PutUint32(id[40:], 0xffffffff) // INET_DIAG_NOCOOKIE
	le.PutUint32(id[44:], 0xffffffff)
	if err := syscall.Sendto(fd, req, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return 0, err
	}
	buf := make([]byte, 4096)
	n, _, err := syscall.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, err
	}
	if n < 16 {
		return 0, errors.New("chaos: sock_diag: short answer")
	}
	switch typ := le.Uint16(buf[4:]); typ {
	case sockDiagByFamily:
	case syscall.NLMSG_ERROR:
		return 0, fmt.Errorf("chaos: sock_diag: error %d", int32(le.Uint32(buf[16:]))) // #nosec G115 -- nlmsgerr.error is a negative errno in an int32
	default:
		return 0, fmt.Errorf("chaos: sock_diag: message type %d", typ)
	}
	// struct inet_diag_msg: family, state, timer, retrans (4), the id
	// (48), expires, rqueue, wqueue, uid (16), inode.
	const inodeAt = 16 + 4 + 48 + 16
	if n < inodeAt+4 {
		return 0, errors.New("chaos: sock_diag: short message")
	}
	return le.Uint32(buf[inodeAt:]), nil
}

// Netlink constants the syscall package does not name.
const (
	sockDiag         = 4  // NETLINK_SOCK_DIAG
	sockDiagByFamily = 20 // SOCK_DIAG_BY_FAMILY
)

// scanInode finds the inode in /proc/net/tcp.
func scanInode(laddr, raddr *net.TCPAddr) (string, error) {
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
