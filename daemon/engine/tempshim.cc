#include "daemon/engine/mq_engine.h"
namespace psmd {
bool MqEngine::PollQuiescing() { return false; }
bool MqEngine::Quiesced() const { return true; }
void MqEngine::SaveState(handover::StateWriter& w) const { w.U32(0); }
Status MqEngine::LoadState(handover::StateReader& r) { uint32_t z; r.U32(&z, "z"); return {}; }
}
