package controller

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/kvgate/kvgate/pkg/aictrl/aictrlpb"
)

// Bounds on what a gateway may send: its id becomes a metric label.
const (
	maxGatewayID = 128
	maxGateways  = 256
)

// Server is the AiCtrl gRPC service over a Controller.
type Server struct {
	pb.UnimplementedAiCtrlServer
	c *Controller

	mu       sync.Mutex
	gateways map[string]struct{}
}

// NewServer serves c.
func NewServer(c *Controller) *Server { return &Server{c: c, gateways: map[string]struct{}{}} }

// label bounds the gateway label's cardinality: past maxGateways distinct
// ids, new ones are counted as "other".
func (s *Server) label(id string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.gateways[id]; ok {
		return id
	}
	if len(s.gateways) >= maxGateways {
		return "other"
	}
	s.gateways[id] = struct{}{}
	return id
}

func checkGatewayID(id string) error {
	if id == "" || len(id) > maxGatewayID {
		return status.Errorf(codes.InvalidArgument, "gateway_id: want 1..%d bytes", maxGatewayID)
	}
	return nil
}

// WatchSnapshots sends the current snapshot (if one is still valid), then
// each new one, until the gateway goes away.
func (s *Server) WatchSnapshots(req *pb.WatchRequest, stream pb.AiCtrl_WatchSnapshotsServer) error {
	if err := checkGatewayID(req.GetGatewayId()); err != nil {
		return err
	}
	w := s.c.addWatcher(s.label(req.GetGatewayId()))
	if w == nil {
		return status.Errorf(codes.ResourceExhausted, "at most %d gateways may watch", maxWatchers)
	}
	defer s.c.removeWatcher(w)
	s.c.log.Info("gateway watching", "gateway", req.GetGatewayId(), "applier_version", req.GetApplierVersion())
	for {
		select {
		case <-stream.Context().Done():
			return nil
		case snap := <-w.ch:
			if err := stream.Send(snap); err != nil {
				return err
			}
		}
	}
}

// AckSnapshot counts a gateway's verdict on a snapshot.
func (s *Server) AckSnapshot(_ context.Context, ack *pb.Ack) (*pb.AckResponse, error) {
	if err := checkGatewayID(ack.GetGatewayId()); err != nil {
		return nil, err
	}
	gw := s.label(ack.GetGatewayId())
	switch ack.GetStatus() {
	case pb.AckStatus_ACK_STATUS_APPLIED:
		s.c.m.acksApplied.WithLabelValues(gw).Inc()
	case pb.AckStatus_ACK_STATUS_REJECTED:
		s.c.m.acksRejected.WithLabelValues(gw).Inc()
		detail := ack.GetErrorDetail()
		if len(detail) > 1024 {
			detail = detail[:1024]
		}
		s.c.log.Warn("gateway rejected a snapshot", "gateway", ack.GetGatewayId(), "epoch", ack.GetEpoch(), "detail", detail)
	default:
		return nil, status.Error(codes.InvalidArgument, "status: want APPLIED or REJECTED")
	}
	return &pb.AckResponse{}, nil
}
