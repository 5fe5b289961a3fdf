package api_test

import "net"

func netParseMAC(s string) (net.HardwareAddr, error) { return net.ParseMAC(s) }
