// Package aictrlpb is the generated Go code of the AI controller protocol,
// proto/loxilb/aictrl/v1/aictrl.proto. `make generate` rebuilds it; it needs
// protoc (Debian protobuf-compiler), protoc-gen-go and protoc-gen-go-grpc on
// PATH (docs/controller.md, "Regenerating the protocol").
package aictrlpb

//go:generate protoc -I ../../../proto --go_out=../../.. --go_opt=module=github.com/kvgate/kvgate --go-grpc_out=../../.. --go-grpc_opt=module=github.com/kvgate/kvgate loxilb/aictrl/v1/aictrl.proto
