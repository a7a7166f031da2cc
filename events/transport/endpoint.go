package transport

import (
	"fmt"
	"net"
	"strings"
)

// splitEndpoint turns a ZeroMQ endpoint into a Go network and address.
// tcp://host:port and ipc://path are supported; in a bind endpoint the host
// may be * (every interface) and the port 0 or * (any free port).
func splitEndpoint(endpoint string, bind bool) (network, addr string, err error) {
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok {
		return "", "", fmt.Errorf("%q has no scheme (want tcp://host:port or ipc://path): %w", endpoint, ErrEndpoint)
	}
	switch scheme {
	case "tcp":
		host, port, err := net.SplitHostPort(rest)
		if err != nil {
			return "", "", fmt.Errorf("%q: %w: %w", endpoint, ErrEndpoint, err)
		}
		if bind {
			if host == "*" {
				host = ""
			}
			if port == "*" {
				port = "0"
			}
		} else if host == "" || host == "*" || port == "" || port == "0" || port == "*" {
			return "", "", fmt.Errorf("%q: a connect endpoint needs a host and a port: %w", endpoint, ErrEndpoint)
		}
		if port == "" {
			return "", "", fmt.Errorf("%q: missing port: %w", endpoint, ErrEndpoint)
		}
		return "tcp", net.JoinHostPort(host, port), nil
	case "ipc":
		if rest == "" {
			return "", "", fmt.Errorf("%q: missing path: %w", endpoint, ErrEndpoint)
		}
		return "unix", rest, nil
	default:
		return "", "", fmt.Errorf("%q: scheme %q is not tcp or ipc: %w", endpoint, scheme, ErrEndpoint)
	}
}

// endpointOf renders a listener's address as an endpoint.
func endpointOf(a net.Addr) string {
	if a.Network() == "unix" {
		return "ipc://" + a.String()
	}
	return "tcp://" + a.String()
}

// CheckEndpoint reports whether Connect (bind false) or Bind (bind true)
// would take endpoint, without connecting or binding.
func CheckEndpoint(endpoint string, bind bool) error {
	_, _, err := splitEndpoint(endpoint, bind)
	return err
}
