// What a server thread of a bench spent since the last reading: its event
// loop's busy time, and its own CPU (user + system, process.threadCpuUsage),
// which is not stretched by other threads taking the cores.
export function threadUsage(): () => { busyMs: number; cpuMs: number } {
  let elu = performance.eventLoopUtilization();
  let cpu = process.threadCpuUsage();
  return () => {
    const busy = performance.eventLoopUtilization(elu);
    const used = process.threadCpuUsage(cpu);
    elu = performance.eventLoopUtilization();
    cpu = process.threadCpuUsage();
    return { busyMs: busy.active, cpuMs: (used.user + used.system) / 1000 };
  };
}
