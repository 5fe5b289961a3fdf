package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"kurma.dev/kurma/internal/image/acibuild"
	"kurma.dev/kurma/internal/image/trust"
)

func keygen(args []string) error {
	fs := flag.NewFlagSet("keygen", flag.ContinueOnError)
	out := fs.String("o", "", "output prefix (writes PREFIX.key and PREFIX.pub)")
	if _, err := parseFlags(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("keygen: -o PREFIX is required")
	}
	priv, pub, err := trust.GenerateKey()
	if err != nil {
		return err
	}
	f, err := os.OpenFile(*out+".key", os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	if _, err := f.Write(priv); err != nil {
		f.Close()
		return fmt.Errorf("keygen: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	if err := os.WriteFile(*out+".pub", pub, 0o644); err != nil {
		return fmt.Errorf("keygen: %w", err)
	}
	return nil
}

func sign(args []string) error {
	fs := flag.NewFlagSet("sign", flag.ContinueOnError)
	keyPath := fs.String("key", "", "private key file")
	pos, err := parseFlags(fs, args)
	if err != nil {
		return err
	}
	if *keyPath == "" || len(pos) != 1 {
		return errors.New("usage: sign --key KEY IMAGE.aci")
	}
	kb, err := os.ReadFile(*keyPath)
	if err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	key, err := trust.ParsePrivateKey(kb)
	if err != nil {
		return fmt.Errorf("sign: key %s: %w", *keyPath, err)
	}
	id, err := acibuild.ImageIDFile(pos[0])
	if err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	if err := os.WriteFile(pos[0]+".sig", trust.Sign(key, id), 0o644); err != nil {
		return fmt.Errorf("sign: %w", err)
	}
	return nil
}

func printID(args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return errors.New("usage: id IMAGE.aci")
	}
	id, err := acibuild.ImageIDFile(args[0])
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(stdout, id)
	return err
}
