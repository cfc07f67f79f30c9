package aictrlpb

import "google.golang.org/protobuf/reflect/protoreflect"

func protoName(s string) protoreflect.Name      { return protoreflect.Name(s) }
func protoNumber(i int) protoreflect.EnumNumber { return protoreflect.EnumNumber(i) }
