// Package prefixdv1 is the generated Go code of prefixd's query API,
// proto/prefixd/v1/prefixd.proto: the IndexService (Match, Score, Pods,
// Stats) and its messages. Match and Score take the same request, Query.
//
// # Basics
//
// Servers embed UnimplementedIndexServiceServer (package rpc does);
// clients call NewIndexServiceClient on a grpc.ClientConn, or use package
// rpc/client, which wraps it for Go pickers.
//
// # Caveats
//
// The .pb.go files are generated: edit the .proto and run `make generate`
// (protoc 3.21.12 and the plugins pinned in go.mod); `make verify` fails
// when they drift. compat.go, written by hand, keeps the names of the
// requests Query replaced as aliases.
package prefixdv1
