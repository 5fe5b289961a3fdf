// Command echo is the test app of the real-cluster tests. On one port it
// serves TCP and UDP: each line (TCP) or datagram (UDP) is sent back as it
// came, except "hostname", which is answered with the pod's hostname. On a
// second port it serves HTTP: GET / answers the hostname, for probes and
// Service tests. It stops on SIGTERM or SIGINT.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	port := flag.Int("port", 8080, "TCP and UDP echo port")
	httpPort := flag.Int("http-port", 8081, "HTTP port (GET / answers the hostname)")
	flag.Parse()
	host, err := os.Hostname()
	if err != nil {
		log.Fatalf("hostname: %v", err)
	}
	tl, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		log.Fatalf("listen tcp: %v", err)
	}
	ul, err := net.ListenPacket("udp", fmt.Sprintf(":%d", *port))
	if err != nil {
		log.Fatalf("listen udp: %v", err)
	}
	hl, err := net.Listen("tcp", fmt.Sprintf(":%d", *httpPort))
	if err != nil {
		log.Fatalf("listen http: %v", err)
	}
	go serveTCP(tl, host)
	go serveUDP(ul, host)
	go func() {
		err := http.Serve(hl, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintln(w, host)
		}))
		log.Fatalf("http: %v", err)
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	<-sigs
}

// answer is the reply to one request line or datagram.
func answer(req, host string) string {
	if strings.TrimSpace(req) == "hostname" {
		return host + "\n"
	}
	return req
}

func serveTCP(l net.Listener, host string) {
	for {
		c, err := l.Accept()
		if err != nil {
			log.Fatalf("accept: %v", err)
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				line, err := r.ReadString('\n')
				if line != "" {
					if _, werr := c.Write([]byte(answer(line, host))); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func serveUDP(c net.PacketConn, host string) {
	buf := make([]byte, 64<<10)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			log.Printf("udp read: %v", err)
			continue
		}
		_, _ = c.WriteTo([]byte(answer(string(buf[:n]), host)), from)
	}
}
