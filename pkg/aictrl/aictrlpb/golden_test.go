package aictrlpb

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
)

// The wire bytes below are written out by hand from the field numbers in
// proto/loxilb/aictrl/v1/aictrl.proto, so a renumbered or retyped field
// fails here rather than on a gateway of another version.
func TestGoldenBytes(t *testing.T) {
	ep := &EpEntry{EpIdx: 1, EpAddr: "10.0.0.2:8000", Role: Role_ROLE_PREFILL, Weight: 50, State: EpState_EP_STATE_DRAINING}
	epHex := "0801" + "120d" + hex.EncodeToString([]byte("10.0.0.2:8000")) + "1801" + "2032" + "2802"
	svc := &ServiceSnapshot{ServiceKey: "k", Eps: []*EpEntry{ep}}
	svcHex := "0a016b" + "1217" + epHex
	cases := []struct {
		name string
		msg  proto.Message
		hex  string
	}{
		{"EpEntry", ep, epHex},
		{"EpEntryZero", &EpEntry{}, ""},
		{"ServiceSnapshot", svc, svcHex},
		{"Snapshot", &Snapshot{Epoch: 7, BootId: "b1", StalenessDeadlineUnixMs: 300, Services: []*ServiceSnapshot{svc},
			MinApplierVersion: 1, Nonce: "n"},
			"0807" + "12026231" + "18ac02" + "221c" + svcHex + "2801" + "32016e"},
		{"WatchRequest", &WatchRequest{GatewayId: "gw", ApplierVersion: 1}, "0a026777" + "1001"},
		{"Ack", &Ack{Epoch: 7, Nonce: "n", Status: AckStatus_ACK_STATUS_REJECTED, ErrorDetail: "x", GatewayId: "gw"},
			"0807" + "12016e" + "1802" + "220178" + "2a026777"},
		{"AckApplied", &Ack{Epoch: 1 << 40, Status: AckStatus_ACK_STATUS_APPLIED}, "08808080808020" + "1801"},
		{"AckResponse", &AckResponse{}, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			want, err := hex.DecodeString(c.hex)
			if err != nil {
				t.Fatal(err)
			}
			got, err := proto.MarshalOptions{Deterministic: true}.Marshal(c.msg)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("marshal:\n got %x\nwant %x", got, want)
			}
			back := c.msg.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(want, back); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(back, c.msg) {
				t.Fatalf("unmarshal: got %v want %v", back, c.msg)
			}
		})
	}
}

func TestFrozenNames(t *testing.T) {
	if got := File_loxilb_aictrl_v1_aictrl_proto.Package(); got != "loxilb.aictrl.v1" {
		t.Fatalf("package %q", got)
	}
	svc := File_loxilb_aictrl_v1_aictrl_proto.Services().ByName("AiCtrl")
	if svc == nil || svc.Methods().ByName("WatchSnapshots") == nil || svc.Methods().ByName("AckSnapshot") == nil {
		t.Fatal("service AiCtrl with WatchSnapshots and AckSnapshot is missing")
	}
	if !svc.Methods().ByName("WatchSnapshots").IsStreamingServer() {
		t.Fatal("WatchSnapshots must be a server stream")
	}
	enums := []struct {
		name string
		vals []string
	}{
		{"Role", []string{"ROLE_UNSPECIFIED", "ROLE_PREFILL", "ROLE_DECODE"}},
		{"EpState", []string{"EP_STATE_UNSPECIFIED", "EP_STATE_ACTIVE", "EP_STATE_DRAINING", "EP_STATE_DISABLED"}},
		{"AckStatus", []string{"ACK_STATUS_UNSPECIFIED", "ACK_STATUS_APPLIED", "ACK_STATUS_REJECTED"}},
	}
	for _, e := range enums {
		d := File_loxilb_aictrl_v1_aictrl_proto.Enums().ByName(protoName(e.name))
		if d == nil {
			t.Fatalf("enum %s missing", e.name)
		}
		for i, v := range e.vals {
			ev := d.Values().ByNumber(protoNumber(i))
			if ev == nil || string(ev.Name()) != v {
				t.Fatalf("%s %d: got %v want %s", e.name, i, ev, v)
			}
		}
	}
	if !strings.HasSuffix(string((&Snapshot{}).ProtoReflect().Descriptor().FullName()), "loxilb.aictrl.v1.Snapshot") {
		t.Fatal("Snapshot full name")
	}
}
