//! vale-ctl: the vale control tool.
//!
//! Speaks valed's control protocol ([`vale_abi::control`]) over `<run dir>/valed.sock`: one
//! request, one reply, per invocation. It never starts valed.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use vale_abi::control::{
    self, default_run_dir, FlowTable, LookupInfo, ModuleArg, PortInfo, Reply, Request, SwitchInfo,
    SOCKET_NAME,
};
use vale_abi::name::{parse_port, parse_switch};

mod capture;
mod top;

/// Exit status when valed refused a request or the conversation failed.
const EXIT_FAILED: u8 = 1;
/// Exit status of a usage error.
const EXIT_USAGE: u8 = 2;
/// Exit status when no valed answers for the run directory.
const EXIT_NO_DAEMON: u8 = 3;

#[derive(Parser, Debug)]
#[command(
    name = "vale-ctl",
    version,
    about = "Control vale switches and ports: list them with counters, create and destroy \
persistent ports, attach TAP devices and network interfaces, set knobs",
    long_about = "vale-ctl controls vale, a virtual local Ethernet in user space. It talks to \
valed, the vale daemon, through the control socket <run dir>/valed.sock: it lists switches \
(valeX) and ports (valeX:Y) with their counters, creates persistent ports, destroys ports and \
whole switches, attaches TAP devices (the host stack, containers) and network interfaces \
(NICs, veths) as ports, and sets switch and port knobs.\n\n\
Switch and port names are valeX and valeX:Y, where X and Y are 1 to 32 letters, digits, '_' \
or '-'.\n\n\
vale-ctl never starts valed: when no valed serves the run directory it says so and exits with \
status 3. Start valed by hand, or let a libvale client (such as vale-pktgen) start it.",
    after_help = "KNOBS (vale-ctl set TARGET KNOB VALUE):\n  \
valeX    batch N          frames gathered from a ring per pass, 1-2048 (default 512)\n  \
valeX    lookup MODULE    learning (default), hub, vlan, flow; see 'vale-ctl lookup --help'\n  \
valeX:Y  moderation US    microseconds between interrupts toward the client, 0 = immediate\n  \
valeX:Y  learn-limit N    most source MACs the learning bridge keeps for the port (default 1024)\n\n\
Switch knobs and learn-limit need an administrator (root, valed's user or valed\n\
--admin-group); moderation needs the port's owner or an administrator.\n\n\
EXAMPLES:\n  \
vale-ctl create vale0:a              persistent port a on switch vale0 (made if absent)\n  \
vale-ctl list                        every switch and port, with counters\n  \
vale-ctl ls vale0:a --json           one port, as JSON\n  \
vale-ctl set vale0 batch 64\n  \
vale-ctl set vale0 lookup hub\n  \
vale-ctl lookup vale0                the lookup module, its configuration and counters\n  \
vale-ctl lookup vale0 vlan --access vale0:a=10 --trunk vale0:up=10,20\n  \
vale-ctl lookup vale0 ./libmine.so --arg k=v   a module built outside vale\n  \
vale-ctl lookup vale0 flow --rules rules.txt    an ordered match/action table\n  \
vale-ctl flow vale0 add 'prio=10 tcp,nw_dst=10.0.0.0/8,tp_dst=22 actions=drop'\n  \
vale-ctl flow vale0 dump             the rules with their hit counters\n  \
vale-ctl set vale0:a moderation 20\n  \
vale-ctl set vale0:a learn-limit 16  a port with at most 16 stations behind it\n  \
vale-ctl attach vale0:h1 --tap vtap1 valed creates TAP vtap1; its frames join vale0\n  \
vale-ctl attach vale0:eth --iface veth0      veth0's frames join vale0 (AF_XDP)\n  \
vale-ctl attach vale0:vm1 --vhost-user /run/vale/vm1.sock   a VM's virtio-net (QEMU)\n  \
vale-ctl detach vale0:eth            veth0 goes back to the kernel\n  \
vale-ctl destroy vale0:a             remove one port (taken from its client, if held)\n  \
vale-ctl rm vale0                    remove switch vale0 and all its ports\n  \
vale-ctl top                         live per-port rates and drops, like top (q to quit)\n  \
vale-ctl capture vale0:a -w a.pcapng -c 1000   the port's frames, both ways, for Wireshark\n  \
vale-ctl capture vale0:a --dir rx -w - | tcpdump -nr -   live into tcpdump\n  \
vale-ctl --run-dir /tmp/v list       ask the valed of another run directory\n\n\
EXIT STATUS:\n  \
0  success\n  \
1  valed refused the request (its message is printed), the name given to list does not\n     \
exist, or the conversation with valed failed\n  \
2  usage error: unknown command or option, missing argument, malformed name\n  \
3  no valed running for the run directory\n\n\
ENVIRONMENT:\n  \
VALE_RUN_DIR   run directory when --run-dir is not given (default /run/vale)\n\n\
FILES:\n  \
<run dir>/valed.sock   valed's control socket; its permissions say who may use vale-ctl"
)]
struct Cli {
    /// Run directory of the valed to talk to [env: VALE_RUN_DIR] [default: /run/vale]
    #[arg(long, global = true, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Print JSON on stdout instead of text (list: the switches; other commands: {"ok":true})
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Capture a port's frames, as pcapng or pcap, to a file or a pipe
    #[command(
        long_about = "Captures the frames of port valeX:Y, of any kind (native, tap, nic, \
vhost-user), and writes them as pcapng (the default) or classic pcap to FILE, or to \
standard output with -w - or no -w, for tcpdump -r, tshark -r, Wireshark, or live into \
'tcpdump -nr -' and 'wireshark -k -i -'.\n\n\
Directions are the port's, as on a network interface: tx is what the port sends into the \
switch (its client's, device's or guest's frames), rx what the switch delivers to it. \
pcapng names the port in its interface block (if_name valeX:Y) and marks each frame \
outbound (tx) or inbound (rx) in its epb_flags, so 'tshark -T fields -e frame.packet_flags_direction' \
or Wireshark's frame details tell them apart; classic pcap has no place for either. An rx \
frame is captured as the switch hands it to the port, with its VLAN tag as the port gets \
it; one the port then drops (its ring full) is in the capture and in the port's RX-DROP. \
Frames carrying offload work (TSO, partial checksum, between ports that offload) are \
captured as they cross the switch: one large frame, checksum not filled in.\n\n\
valed copies each captured frame (up to --snaplen bytes) into a buffer of --buffer MiB \
that it shares with vale-ctl. When vale-ctl cannot keep up, or stops reading (a stopped \
pipe), valed counts the frames that did not fit as capture drops and goes on: the port \
loses no frame and forwarding pays only the copy. The drops are printed at the end and, in \
pcapng, written to an interface statistics block (isb_ifdrop).\n\n\
The capture ends after --count frames, after --duration seconds, at Ctrl-C (SIGINT, \
SIGTERM, SIGHUP), when the reader of a pipe goes away, when the port goes away (destroyed, \
detached and not persistent, its client gone), or when valed stops; the output is always \
complete. It prints how many frames it captured and dropped on standard error.\n\n\
Capturing a port reads its traffic: only the port's owner (the uid in 'vale-ctl list') or \
an administrator may, as only they may tune it. A user that is not an administrator gets at \
most 64 MiB of buffer, and the buffer counts in its port memory (valed \
--max-port-memory-per-user) until the capture ends; a port has at most 8 captures at once.\n\n\
EXPRESSION, in tcpdump's language (pcap-filter(7): 'icmp', 'tcp port 22', 'not arp', \
'ether host 02:00:00:00:00:01'), picks the frames captured: vale-ctl compiles it with \
libpcap's pcap_compile (libpcap is loaded only then) into a classic BPF program, which valed \
checks (known instructions, forward jumps inside the program, a return at the end) and runs \
on each frame's captured bytes (the first --snaplen). Frames it does not accept are neither \
captured nor counted; a frame that finds the buffer full is counted as a capture drop before \
the filter sees it. Filters run on the workers every port shares, so each user's filters \
together run on a budget (about 15 million instructions a second, all of that user's \
captures and workers together): a frame met when it is spent is not filtered nor captured \
and is counted as a capture drop too, shown apart ('over valed's filter budget'). A short \
filter, a smaller --snaplen or a quieter port keep within it.",
        after_help = "EXAMPLES:\n  \
vale-ctl capture vale0:a -w a.pcapng -c 1000      both directions, until 1000 frames\n  \
vale-ctl capture vale0:a --dir rx -w - | tcpdump -nr -    live, what vale0:a receives\n  \
vale-ctl capture vale0:h1 --duration 10 --format pcap -w h1.pcap\n  \
vale-ctl capture vale0:vm1 --snaplen 128 -w - | tshark -r - -q -z io,stat,1\n  \
vale-ctl capture vale0:h1 -c 10 -w - icmp or arp | tcpdump -nr -"
    )]
    Capture {
        /// The port, valeX:Y
        #[arg(value_name = "PORT", value_parser = port_name)]
        port: String,
        /// Write to FILE (- or no -w: standard output)
        #[arg(short = 'w', long = "write", value_name = "FILE")]
        file: Option<PathBuf>,
        /// Which frames: rx (the switch delivers to the port), tx (the port sends), both
        #[arg(long, value_enum, default_value = "both")]
        dir: capture::Dir,
        /// Stop after COUNT frames
        #[arg(short = 'c', long, value_name = "COUNT",
              value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// Stop after SECS seconds (0.1 to 3600)
        #[arg(long, value_name = "SECS", value_parser = interval)]
        duration: Option<std::time::Duration>,
        /// Bytes of each frame kept (1 to 65535); longer frames are cut, their length kept
        #[arg(short = 's', long, default_value = "2048", value_name = "N",
              value_parser = clap::value_parser!(u32).range(1..=65535))]
        snaplen: u32,
        /// Size of valed's capture buffer, MiB (1 to 256)
        #[arg(short = 'B', long = "buffer", default_value = "16", value_name = "MIB",
              value_parser = clap::value_parser!(u32).range(1..=256))]
        buffer: u32,
        /// Output format
        #[arg(long, value_enum, default_value = "pcapng")]
        format: capture::Format,
        /// Print nothing on standard error at the end
        #[arg(short = 'q', long)]
        quiet: bool,
        /// Capture only the frames this tcpdump expression accepts (pcap-filter(7))
        #[arg(value_name = "EXPRESSION", trailing_var_arg = true)]
        expression: Vec<String>,
    },
    /// List switches and ports with their counters
    #[command(
        visible_alias = "ls",
        long_about = "Lists every switch, or only switch valeX, or only port valeX:Y. Each \
switch gets a header line\n\n  \
valeX  lookup MODULE  batch N  ports N\n\n\
and, under it, a table of its ports:\n\n  \
NAME       the port, valeX:Y\n  \
KIND       native: a libvale client\n  \
UID        the user the port belongs to: only it or an administrator may destroy,\n             \
detach or tune the port, or reopen it once free\n  \
PID        pid of the process holding the port (valed's own for tap, nic, vhost-user), - if none\n  \
PERSIST    yes: made by 'vale-ctl create', stays when no client holds it\n  \
RINGS      tx/rx rings (- while no client holds the port)\n  \
SLOTS      slots per ring\n  \
BUF        buffer size, bytes\n  \
MOD(us)    interrupt moderation toward the client, microseconds\n  \
LEARNT     source MACs the learning bridge holds for the port / its learn-limit\n  \
TX-PKTS    frames the client sent into the switch (TX-BYTES: their bytes)\n  \
RX-PKTS    frames the switch delivered to the client (RX-BYTES: their bytes)\n  \
RX-DROP    frames for the port dropped: its receive ring was full, nobody held it, or\n             \
its device refused them or was down\n  \
TX-DROP    frames from the port that had nowhere to go\n  \
BAD        frames refused because the client wrote bad ring values (a guest: bad\n             \
descriptors, chains or frames)\n  \
NOLEARN    source MACs of the port's frames not learnt: the port held its learn-limit, or\n             \
the table had no room but other ports' live entries (the frames are still\n             \
forwarded)\n\n\
Under a switch's table, a line per port whose device negotiated something: for a\n\
vhost-user port with a guest, the virtio features the guest acked and the offloads\n\
frames to it may carry (the rest the switch does in software).\n\n\
With no switches, prints nothing. With --json, prints a JSON array of switches (name, \
lookup, batch, ports), each port with the fields above (name, kind, device, mode, state, \
persistent, owner_pid, owner_uid, tx_rings, rx_rings, slots, buf_size, moderation_us, learn_limit, \
learnt, negotiated when there is something, counters); for one switch or one port it \
is still an array, of that one switch (with only that port). An unknown NAME is an error."
    )]
    List {
        /// Show only this switch (valeX) or port (valeX:Y)
        #[arg(value_name = "NAME", value_parser = any_name)]
        name: Option<String>,
    },
    /// Create a persistent port (and its switch, if absent)
    #[command(
        long_about = "Creates persistent port valeX:Y, and switch valeX if it does not \
exist. A persistent port stays, with its counters, when no client holds it; a client that \
opens it later gets it. Creating a port that exists makes it persistent."
    )]
    Create {
        /// The port, valeX:Y
        #[arg(value_name = "PORT", value_parser = port_name)]
        port: String,
    },
    /// Destroy a port or a whole switch
    #[command(
        visible_alias = "rm",
        long_about = "Destroys port valeX:Y, or switch valeX with all its ports. A port held \
by a client is taken from it: the client keeps its mapping, but valed no longer forwards \
to or from it."
    )]
    Destroy {
        /// The port (valeX:Y) or switch (valeX)
        #[arg(value_name = "NAME", value_parser = any_name)]
        name: String,
    },
    /// Attach a TAP device, a network interface or a vhost-user VM as a port
    #[command(
        long_about = "Attaches a device of the host as port valeX:Y (and makes switch valeX \
if absent). valed itself moves the device's frames to and from the switch; the port stays \
until 'vale-ctl detach' or 'vale-ctl destroy'. Attaching needs an administrator (root, \
valed's own user, or a member of valed --admin-group); the port then belongs to the caller.\n\n\
--tap NAME creates TAP device NAME, or adopts it if a persistent TAP of that name exists and \
nobody has it open. The TAP carries TSO segments and partial checksums as they are to other \
TAP ports; toward other ports valed segments and checksums in software. Move the TAP into a \
container's network namespace with 'ip link set NAME netns NS'; it stays on the switch. \
With --persist the TAP device outlives valed and the port.\n\n\
--iface NAME binds network interface NAME (a NIC, a veth): AF_XDP in the driver's XDP mode \
(xdp) or the kernel's generic mode (xdp-generic), or AF_PACKET (packet). Without --mode \
valed tries them in that order and keeps the first that binds; 'vale-ctl list' shows which. \
While attached, the interface's received frames go to the switch instead of the kernel.\n\n\
--vhost-user PATH makes valed the virtio-net device of a virtual machine (QEMU's \
'-netdev vhost-user', any vhost-user front end) through the Unix socket PATH: valed listens \
there, and serves one front end after the other (QEMU '-chardev socket,path=PATH,reconnect=1'); \
with --client valed connects to a front end listening there instead (QEMU \
'server=on,wait=off'), again after each disconnection. The guest's RAM must be shared memory \
('-object memory-backend-memfd,...,share=on'). The port is down while no front end is connected. \
The port offers --queues queue pairs (QEMU '-netdev vhost-user,queues=N' with \
'-device virtio-net-pci,mq=on', up to as many); each pair has a thread of its own in valed, \
and the frames of one flow toward the guest stay on one receive queue. valed also offers \
the MTU ('-device virtio-net-pci,host_mtu=9000'; longer frames without segmentation are \
dropped both ways), link status, checksum and TCP segmentation \
offload both ways, merged receive buffers and event indices; 'vale-ctl list' shows what the \
guest took.",
        group(clap::ArgGroup::new("device").required(true).args(["tap", "iface", "vhost_user"]))
    )]
    Attach {
        /// The port, valeX:Y
        #[arg(value_name = "PORT", value_parser = port_name)]
        port: String,
        /// A TAP device, created or adopted
        #[arg(long, value_name = "NAME")]
        tap: Option<String>,
        /// Keep the TAP device after valed lets it go
        #[arg(long, requires = "tap", conflicts_with = "iface")]
        persist: bool,
        /// A network interface, bound through AF_XDP or AF_PACKET
        #[arg(long, value_name = "NAME")]
        iface: Option<String>,
        /// How to bind the interface (default: the first of these that works)
        #[arg(long, requires = "iface", value_parser = ["xdp", "xdp-generic", "packet"])]
        mode: Option<String>,
        /// A vhost-user socket: valed listens there (connects with --client)
        #[arg(long, value_name = "PATH")]
        vhost_user: Option<PathBuf>,
        /// Connect to a front end listening at the vhost-user socket
        #[arg(long, requires = "vhost_user")]
        client: bool,
        /// Queue pairs the vhost-user port offers, 1-16 (default 4)
        #[arg(long, value_name = "N", requires = "vhost_user", value_parser = clap::value_parser!(u8).range(1..=16))]
        queues: Option<u8>,
    },
    /// Give a TAP or NIC port's device back
    #[command(
        long_about = "Stops port valeX:Y's traffic and gives its device back: a TAP device is \
closed (and goes away unless it was attached with --persist); a network interface returns \
to the kernel. The port goes too, unless it is persistent ('vale-ctl create')."
    )]
    Detach {
        /// The port, valeX:Y
        #[arg(value_name = "PORT", value_parser = port_name)]
        port: String,
    },
    /// Write the running configuration to valed's configuration file
    #[command(
        long_about = "Writes the running configuration to the file valed was started with \
(valed --config FILE), atomically (a new file renamed over the old one): every switch with \
its batch and lookup module (its arguments and, for flow, its rules), and its persistent and \
device ports (TAP, NIC, vhost-user: their devices and arguments) with their knobs \
(moderation, learn-limit) and owners. Ports a client opened and holds are the client's and \
are not saved. valed applies the file when it starts again, and re-adopts TAP devices (a \
TAP attached with --persist and moved into a network namespace is found there again) and \
NICs, so traffic resumes with no action. Needs an administrator. Prints the path and what \
was saved; with --json, {\"path\":...,\"switches\":N,\"ports\":N}."
    )]
    Save,
    /// Set a knob of a switch or a port
    #[command(
        long_about = "Sets a knob of switch valeX or of port valeX:Y. The change takes \
effect at once.\n\n\
Switch knobs:\n  \
batch N          frames gathered from a source ring per pass, 1-2048 (default 512)\n  \
lookup MODULE    how destinations are chosen, unconfigured ('vale-ctl lookup'\n                   \
configures one):\n                     \
learning   the learning bridge: learns source MACs, floods unknown,\n                                \
broadcast and multicast destinations (default)\n                     \
hub        floods every frame to every other port\n                     \
vlan       the 802.1Q bridge, every port an access port of VLAN 1\n                     \
flow       the flow table, empty: every frame goes to the bridge\n\n\
Port knobs:\n  \
moderation US    microseconds between interrupts toward the client,\n                   \
0-1000000; 0 = immediate (default)\n  \
learn-limit N    most source MACs the learning bridge keeps for the port,\n                   \
0-1048576 (default 1024; 0: learn none). A port at its limit\n                   \
learns a new address only in place of one of its own; no port\n                   \
ever pushes out another port's live entries"
    )]
    Set {
        /// The switch (valeX) or port (valeX:Y)
        #[arg(value_name = "TARGET", value_parser = any_name)]
        target: String,
        /// batch or lookup (switch); moderation or learn-limit (port)
        #[arg(value_name = "KNOB")]
        knob: String,
        /// The new value
        #[arg(value_name = "VALUE", allow_negative_numbers = true)]
        value: String,
    },
    /// Show or choose a switch's lookup module
    #[command(
        long_about = "With SWITCH alone, shows switch valeX's lookup module: its name, where it \
comes from (built-in, or the shared object's path), the configuration it was made with and its \
own counters.\n\n\
With MODULE, makes it the switch's lookup module, configured by --arg KEY=VALUE (repeatable, \
in order) and, for vlan, --access, --trunk and --default. MODULE is a built-in module's name \
or the path of a shared object built against vale_lookup.h (a path holds a '/': \
./libmine.so). A module that cannot be loaded or configured leaves the switch's module as it \
was, and the error says why. The swap loses and duplicates no frame: each batch is forwarded \
by the old module or by the new. Choosing a module needs an administrator.\n\n\
Built-in modules and their arguments:\n  \
learning   the learning bridge (default). --arg entries=N (table size, 64-1048576, default\n             \
8192), --arg age=S (seconds an address lives unrefreshed, default 300)\n  \
hub        floods every frame to every other port; no arguments\n  \
vlan       an 802.1Q learning bridge, a learning table per VLAN, flooding kept inside\n             \
the VLAN. --access PORT=VID: an access port (untagged frames of VLAN VID; a\n             \
frame tagged with another VLAN is dropped and counted). --trunk PORT=VIDS: a\n             \
trunk port carrying frames tagged with the VLANs listed (10,20,30-39). Tags\n             \
are added and removed as frames leave. --default VID|none: the VLAN of ports\n             \
not named (default 1; none: they get and send nothing). PORT is valeX:Y or Y.\n             \
--arg entries=N (each VLAN's table, default 1024), --arg age=S\n  \
flow       an ordered match/action table (see 'vale-ctl flow --help'). --rules FILE:\n             \
its rules, one a line; vale-ctl reads the file and sends its text. --arg\n             \
default=normal|drop|flood|output:PORT: what a frame matching no rule gets\n             \
(default normal: the learning bridge). --arg entries=N, --arg age=S: the\n             \
learning table of 'normal', as learning's",
        after_help = "EXAMPLES:\n  \
vale-ctl lookup vale0\n  \
vale-ctl lookup vale0 vlan --access a=10 --access b=20 --trunk up=10,20\n  \
vale-ctl lookup vale0 flow --rules rules.txt --arg default=drop\n  \
vale-ctl lookup vale0 ./libmylookup.so --arg k=v\n  \
vale-ctl lookup vale0 learning        back to the default"
    )]
    Lookup {
        /// The switch, valeX
        #[arg(value_name = "SWITCH", value_parser = switch_name)]
        switch: String,
        /// A built-in module's name, or a shared object's path
        #[arg(value_name = "MODULE")]
        module: Option<String>,
        /// A module argument (repeatable)
        #[arg(long = "arg", value_name = "KEY=VALUE", requires = "module", value_parser = key_value)]
        args: Vec<(String, String)>,
        /// vlan: an access port and its VLAN (repeatable)
        #[arg(long, value_name = "PORT=VID", requires = "module")]
        access: Vec<String>,
        /// vlan: a trunk port and its VLANs (repeatable)
        #[arg(long, value_name = "PORT=VIDS", requires = "module")]
        trunk: Vec<String>,
        /// vlan: the VLAN of ports not named, or none
        #[arg(long, value_name = "VID|none", requires = "module")]
        default: Option<String>,
        /// flow: a file of rules, one a line
        #[arg(long, value_name = "FILE", requires = "module")]
        rules: Option<PathBuf>,
    },
    /// Add, delete and show the rules of a switch's flow table
    #[command(
        long_about = "Changes or shows the rules of switch valeX, whose lookup module must be \
flow ('vale-ctl lookup valeX flow [--rules FILE]').\n\n\
A rule is\n\n  \
[prio=N] [FIELD=VALUE|SHORTHAND],... actions=ACTION\n\n\
with fields and shorthands separated by commas or spaces, in any order:\n  \
prio=N             0-65535, higher wins (default 32768); equal priorities:\n                     \
the rule added first wins. Also priority=N\n  \
in_port=PORT       frames from port valeX:Y\n  \
dl_src=MAC[/MASK]  source MAC (xx:xx:xx:xx:xx:xx), masked if MASK given\n  \
dl_dst=MAC[/MASK]  destination MAC\n  \
dl_type=N          EtherType (after an 802.1Q tag), 0x0800 or 2048\n  \
dl_vlan=VID|none   the 802.1Q tag's VLAN (0-4095), or no tag\n  \
nw_src=A.B.C.D[/LEN], nw_dst=...   IPv4 addresses, prefixes (needs ip)\n  \
ipv6_src=ADDR[/LEN], ipv6_dst=...  IPv6 addresses, prefixes (needs ipv6)\n  \
nw_proto=N         IP protocol, 0-255 (needs ip or ipv6)\n  \
tp_src=N[/MASK], tp_dst=N[/MASK]   TCP/UDP ports (need tcp or udp)\n  \
ip, ipv6, arp      dl_type=0x0800, 0x86dd, 0x0806\n  \
icmp, tcp, udp     ip with nw_proto=1, 6, 17\n  \
icmp6, tcp6, udp6  ipv6 with nw_proto=58, 6, 17\n\n\
ACTION is one of: output:PORT (to port valeX:Y of this switch; a port not there now\n\
drops the frames and counts them as no_port), drop, flood (every other port),\n\
normal (the learning bridge decides). A frame matching no rule gets the table's\n\
default (normal unless set with --arg default=...).\n\n\
add RULE...        adds rules (each argument one rule, --rules FILE one a line): all or\n                     \
none; a bad rule is refused with its line and what is wrong, and the\n                     \
table stays as it was. Prints the rules added with their ids.\n\
del ID|MATCH       deletes rule ID (7 or id=7), or every rule whose match is exactly\n                     \
MATCH (with prio=N: and whose priority is N). Prints what went.\n\
dump               every rule in the order they are tried, with its id and hit counter.\n\n\
add and del need an administrator, as choosing the module does; dump is open to anyone\n\
who may connect. Changes take effect at once, under traffic: each batch of frames is\n\
decided by the table before the change or by the table after, never by both, and the\n\
hit counters of the rules that stay go on counting.",
        after_help = "EXAMPLES:\n  \
vale-ctl lookup vale0 flow --rules rules.txt\n  \
vale-ctl flow vale0 add 'prio=10 tcp,nw_dst=10.0.0.0/8,tp_dst=22 actions=drop'\n  \
vale-ctl flow vale0 add 'in_port=vale0:a actions=output:vale0:b' 'actions=drop'\n  \
vale-ctl flow vale0 add --rules more.txt\n  \
vale-ctl flow vale0 del 7\n  \
vale-ctl flow vale0 del 'prio=10 tcp,nw_dst=10.0.0.0/8,tp_dst=22'\n  \
vale-ctl flow vale0 dump --json"
    )]
    Flow {
        /// The switch, valeX
        #[arg(value_name = "SWITCH", value_parser = switch_name)]
        switch: String,
        #[command(subcommand)]
        op: FlowOp,
    },
    /// Live per-port rates (packets, bits, drops per second), refreshed like top
    #[command(
        long_about = "Shows every port's rates, refreshed every second (--interval), like top: \
the busiest ports first. It reads the counters 'vale-ctl list' shows, and the workers' \
counters, over the control socket, and shows what changed per second since the last refresh.\n\n\
The header gives the time, the number of ports, the totals of the columns below and each \
forwarding worker's busy share (CPU time of its thread, polling and forwarding, per second of \
wall time). Then a line per port:\n\n  \
PORT      the port, valeX:Y\n  \
KIND      native, tap, nic or vhost-user\n  \
STATE     up; down (its device is down or gone); free (persistent, nobody holds it)\n  \
RX-PPS    frames per second the switch delivered to the port (RX-BPS: bits per second)\n  \
TX-PPS    frames per second the port sent into the switch (TX-BPS: bits per second)\n  \
DROPS/S   frames per second dropped: for the port (its ring full, nobody holding it, its\n            \
device refusing them) or from it (nowhere to go); RX-DROP plus TX-DROP of 'list'\n  \
BAD/S     frames per second refused because the client wrote bad ring values\n\n\
A port that appeared since the last refresh shows - until the next. Rates read as 1.23k, \
4.56M, 7.89G (powers of 1000).\n\n\
On a terminal, top takes the whole screen (as many ports as fit) until q or Ctrl-C. With \
--once or -n COUNT, or when stdout is not a terminal, it prints plain tables one after the \
other (the first after one interval: a rate needs two looks), all ports, and exits after COUNT \
of them (or at Ctrl-C, SIGTERM). With --json, each refresh is one line of JSON: \
{\"interval_s\", \"ports\": [{\"name\", \"kind\", \"state\", \"rx_pps\", \"rx_bps\", \
\"tx_pps\", \"tx_bps\", \"drops_per_s\", \"bad_input_per_s\"}], \"workers\": [{\"id\", \
\"busy_percent\"}]} (null where a port is new).\n\n\
Anyone who may connect to valed may watch every port: top changes nothing.",
        after_help = "EXAMPLES:\n  \
vale-ctl top                      every port, live, until q\n  \
vale-ctl top vale0                the ports of switch vale0\n  \
vale-ctl top vale0:a --once       one table of one port, after one second\n  \
vale-ctl top -n 10 -i 0.5 --json  ten JSON lines, half a second apart"
    )]
    Top {
        /// Show only this switch (valeX) or port (valeX:Y)
        #[arg(value_name = "NAME", value_parser = any_name)]
        name: Option<String>,
        /// Seconds between refreshes (0.1 to 3600)
        #[arg(short = 'i', long, default_value = "1", value_name = "SECS",
              value_parser = interval)]
        interval: std::time::Duration,
        /// Show one table (after one interval) and exit: -n 1
        #[arg(long, conflicts_with = "count")]
        once: bool,
        /// Show COUNT tables and exit
        #[arg(short = 'n', long, value_name = "COUNT",
              value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
}

/// Seconds between refreshes of `top`.
fn interval(s: &str) -> Result<std::time::Duration, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(std::time::Duration::from_secs_f64(v)),
        _ => Err(format!("expected seconds from 0.1 to 3600, not '{s}'")),
    }
}

#[derive(Subcommand, Debug)]
enum FlowOp {
    /// Add rules (all or none)
    Add {
        /// Rules, one an argument
        #[arg(value_name = "RULE", required_unless_present = "rules")]
        rule: Vec<String>,
        /// A file of rules, one a line (blank lines and lines starting with # skipped)
        #[arg(long, value_name = "FILE")]
        rules: Option<PathBuf>,
    },
    /// Delete rules: one by id, or all with exactly a match
    Del {
        /// A rule id (7, id=7) or a match ([prio=N] FIELD=VALUE,...)
        #[arg(value_name = "ID|MATCH")]
        selector: String,
    },
    /// Every rule with its hit counter
    Dump,
}

/// A switch (`valeX`).
fn switch_name(s: &str) -> Result<String, String> {
    parse_switch(s)?;
    Ok(s.to_string())
}

/// `KEY=VALUE`.
fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, not '{s}'")),
    }
}

/// The `vlan` module's arguments from `--access`, `--trunk` and `--default`: ports as full
/// names (`Y` is taken as `SWITCH:Y`).
fn vlan_args(
    switch: &str,
    access: &[String],
    trunk: &[String],
    default: Option<&str>,
) -> Result<Vec<ModuleArg>, String> {
    let mut out = Vec::new();
    for (key, list) in [("access", access), ("trunk", trunk)] {
        for a in list {
            let (port, vids) = a
                .split_once('=')
                .ok_or_else(|| format!("--{key} takes PORT=VLANS, not '{a}'"))?;
            let port = if port.contains(':') {
                port.to_string()
            } else {
                format!("{switch}:{port}")
            };
            let (sw, _) = parse_port(&port)?;
            if sw != switch {
                return Err(format!(
                    "--{key} {a}: port '{port}' is not on switch '{switch}'"
                ));
            }
            out.push(ModuleArg {
                key: key.to_string(),
                value: format!("{port}={vids}"),
            });
        }
    }
    if let Some(d) = default {
        out.push(ModuleArg {
            key: "default".into(),
            value: d.to_string(),
        });
    }
    Ok(out)
}

/// A switch (`valeX`) or a port (`valeX:Y`).
fn any_name(s: &str) -> Result<String, String> {
    if s.contains(':') {
        parse_port(s)?;
    } else {
        parse_switch(s)?;
    }
    Ok(s.to_string())
}

/// A port (`valeX:Y`).
fn port_name(s: &str) -> Result<String, String> {
    parse_port(s)?;
    Ok(s.to_string())
}

/// Why vale-ctl failed.
enum Failure {
    /// No valed answers at the socket.
    NoDaemon(PathBuf, io::Error),
    /// A refusal, from valed or from the client-side checks of its answer.
    Refused(String),
    /// Anything else: the conversation with valed broke.
    Other(anyhow::Error),
    /// A usage error clap could not see.
    Usage(String),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Other(e)
    }
}

fn main() -> ExitCode {
    vale_man::write_if_asked("1", <Cli as clap::CommandFactory>::command);
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::NoDaemon(dir, e)) => {
            eprintln!("vale-ctl: no valed running for {} ({e})", dir.display());
            ExitCode::from(EXIT_NO_DAEMON)
        }
        Err(Failure::Refused(message)) => {
            eprintln!("vale-ctl: {message}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(Failure::Other(e)) => {
            eprintln!("vale-ctl: {e:#}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(Failure::Usage(message)) => {
            eprintln!("vale-ctl: {message}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn run(cli: &Cli) -> Result<(), Failure> {
    let run_dir = cli.run_dir.clone().unwrap_or_else(default_run_dir);
    // Usage errors clap cannot see come before any word with valed.
    let lookup_req = match &cli.command {
        Command::Lookup {
            switch,
            module,
            args,
            access,
            trunk,
            default,
            rules,
        } => {
            if rules.is_some() && module.as_deref() != Some("flow") {
                return Err(Failure::Usage(
                    "--rules configures the flow module only".into(),
                ));
            }
            let mut req = lookup_request(
                switch,
                module.as_deref(),
                args,
                access,
                trunk,
                default.as_deref(),
            )?;
            if let (Some(path), Request::SetLookup { args, .. }) = (rules, &mut req) {
                args.push(ModuleArg {
                    key: "rules".into(),
                    value: read_rules(path)?,
                });
            }
            Some(req)
        }
        Command::Flow { switch, op } => Some(match op {
            FlowOp::Add { rule, rules } => {
                let mut text = rule.join("\n");
                if let Some(path) = rules {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text += &read_rules(path)?;
                }
                Request::FlowAdd {
                    switch: switch.clone(),
                    rules: text,
                }
            }
            FlowOp::Del { selector } => Request::FlowDel {
                switch: switch.clone(),
                selector: selector.clone(),
            },
            FlowOp::Dump => Request::FlowDump {
                switch: switch.clone(),
            },
        }),
        _ => None,
    };
    let sock = connect(&run_dir)?;
    match &cli.command {
        Command::Capture {
            port,
            file,
            dir,
            count,
            duration,
            snaplen,
            buffer,
            format,
            quiet,
            expression,
        } => capture::run(
            &sock,
            &capture::CaptureArgs {
                port,
                file: file.as_ref(),
                dir: *dir,
                count: *count,
                duration: *duration,
                snaplen: *snaplen,
                buffer_mib: *buffer,
                format: *format,
                quiet: *quiet,
                filter: (!expression.is_empty())
                    .then(|| expression.join(" "))
                    .as_deref(),
            },
        ),
        Command::Top {
            name,
            interval,
            once,
            count,
        } => top::run(
            &sock,
            &top::TopArgs {
                name: name.as_deref(),
                interval: *interval,
                count: if *once { Some(1) } else { *count },
                json: cli.json,
            },
        ),
        Command::List { name } => {
            let switches = match ask(&sock, &Request::List)? {
                Reply::List { switches } => switches,
                other => return Err(unexpected(&other)),
            };
            let views = select(switches, name.as_deref())?;
            if cli.json {
                let list: Vec<&SwitchInfo> = views.iter().map(|v| &v.info).collect();
                let text = serde_json::to_string_pretty(&list).context("cannot format JSON")?;
                output(&format!("{text}\n"))
            } else {
                output(&render(&views))
            }
        }
        Command::Create { port } => done(cli, ask(&sock, &Request::Create { port: port.clone() })?),
        Command::Attach {
            port,
            tap,
            persist,
            iface,
            mode,
            vhost_user,
            client,
            queues,
        } => {
            let mut args = BTreeMap::new();
            let kind = match (tap, iface) {
                _ if vhost_user.is_some() => {
                    // valed resolves no path against our directory: send it absolute.
                    let path = vhost_user.as_deref().expect("checked");
                    let path = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
                    args.insert("path".to_string(), path.to_string_lossy().into_owned());
                    if *client {
                        args.insert("client".to_string(), "yes".to_string());
                    }
                    if let Some(q) = queues {
                        args.insert("queues".to_string(), q.to_string());
                    }
                    "vhost-user"
                }
                (Some(name), _) => {
                    args.insert("name".to_string(), name.clone());
                    if *persist {
                        args.insert("persist".to_string(), "yes".to_string());
                    }
                    "tap"
                }
                (None, Some(iface)) => {
                    args.insert("iface".to_string(), iface.clone());
                    if let Some(m) = mode {
                        args.insert("mode".to_string(), m.clone());
                    }
                    "nic"
                }
                (None, None) => unreachable!("clap requires --tap, --iface or --vhost-user"),
            };
            let req = Request::Attach {
                port: port.clone(),
                kind: kind.to_string(),
                args,
            };
            done(cli, ask(&sock, &req)?)
        }
        Command::Detach { port } => done(cli, ask(&sock, &Request::Detach { port: port.clone() })?),
        Command::Destroy { name } => {
            done(cli, ask(&sock, &Request::Destroy { name: name.clone() })?)
        }
        Command::Lookup { rules, .. } => {
            let req = lookup_req.expect("made above");
            match ask(&sock, &req).map_err(|e| in_file(e, rules.as_ref()))? {
                Reply::Lookup { lookup } if cli.json => {
                    let text =
                        serde_json::to_string_pretty(&lookup).context("cannot format JSON")?;
                    output(&format!("{text}\n"))
                }
                Reply::Lookup { lookup } => output(&render_lookup(&lookup)),
                other => Err(unexpected(&other)),
            }
        }
        Command::Flow { op, .. } => {
            let req = lookup_req.expect("made above");
            // A bad rule's line is the file's line when the rules came from a file alone.
            let file = match (op, &cli.command) {
                (
                    FlowOp::Add {
                        rule,
                        rules: Some(p),
                    },
                    _,
                ) if rule.is_empty() => Some(p),
                _ => None,
            };
            let reply = ask(&sock, &req).map_err(|e| in_file(e, file))?;
            match reply {
                Reply::Flows { flows } if cli.json => {
                    let text =
                        serde_json::to_string_pretty(&flows).context("cannot format JSON")?;
                    output(&format!("{text}\n"))
                }
                Reply::Flows { flows } => output(&render_flows(&flows, op)),
                other => Err(unexpected(&other)),
            }
        }
        Command::Save => match ask(&sock, &Request::Save)? {
            Reply::Saved {
                path,
                switches,
                ports,
            } => {
                if cli.json {
                    let v = serde_json::json!({"path": path, "switches": switches, "ports": ports});
                    output(&format!("{v}\n"))
                } else {
                    output(&format!(
                        "saved {switches} switches, {ports} ports to {path}\n"
                    ))
                }
            }
            other => Err(unexpected(&other)),
        },
        Command::Set {
            target,
            knob,
            value,
        } => {
            let req = Request::Set {
                target: target.clone(),
                knob: knob.clone(),
                value: value.clone(),
            };
            done(cli, ask(&sock, &req)?)
        }
    }
}

/// The text of rules file `path`: vale-ctl reads it (valed opens no path a client names).
fn read_rules(path: &Path) -> Result<String, Failure> {
    std::fs::read_to_string(path)
        .map_err(|e| Failure::Refused(format!("cannot read rules file {}: {e}", path.display())))
}

/// A refusal naming a rule's line, said to be a line of `file`.
fn in_file(e: Failure, file: Option<&PathBuf>) -> Failure {
    match (e, file) {
        (Failure::Refused(m), Some(f)) if m.starts_with("bad rule at line") => {
            Failure::Refused(format!("{}: {m}", f.display()))
        }
        (e, _) => e,
    }
}

/// `vale-ctl flow` as text: the rules, each with its id and hits.
fn render_flows(t: &FlowTable, op: &FlowOp) -> String {
    let mut s = match op {
        FlowOp::Dump => format!(
            "{}  flow  rules {}  default {}  missed {}\n",
            t.switch,
            t.rules.len(),
            t.default,
            t.missed
        ),
        FlowOp::Add { .. } => format!("{}  added {}\n", t.switch, t.rules.len()),
        FlowOp::Del { .. } => format!("{}  deleted {}\n", t.switch, t.rules.len()),
    };
    let wi = t
        .rules
        .iter()
        .map(|r| r.id.to_string().len())
        .max()
        .unwrap_or(0);
    let wh = t
        .rules
        .iter()
        .map(|r| r.hits.to_string().len())
        .max()
        .unwrap_or(0);
    for r in &t.rules {
        let m = if r.matches.is_empty() {
            String::new()
        } else {
            format!("{} ", r.matches)
        };
        s += &format!(
            "  id={:<wi$}  hits={:<wh$}  prio={} {m}actions={}\n",
            r.id, r.hits, r.priority, r.actions
        );
    }
    s
}

fn connect(run_dir: &Path) -> Result<UnixStream, Failure> {
    UnixStream::connect(run_dir.join(SOCKET_NAME))
        .map_err(|e| Failure::NoDaemon(run_dir.to_path_buf(), e))
}

/// Sends one request and returns valed's reply; `Reply::Error` becomes a refusal.
fn ask(sock: &UnixStream, req: &Request) -> Result<Reply, Failure> {
    match control::exchange(sock, req).context("cannot exchange a request with valed")? {
        Some((Reply::Error { message }, _)) => Err(Failure::Refused(message)),
        Some((reply, _fds)) => Ok(reply),
        None => Err(anyhow!("valed closed the connection without replying").into()),
    }
}

fn unexpected(reply: &Reply) -> Failure {
    anyhow!("unexpected reply from valed: {reply:?}").into()
}

/// Finishes a command whose success is `Reply::Ok`: quiet, or `{"ok":true}` with `--json`.
fn done(cli: &Cli, reply: Reply) -> Result<(), Failure> {
    match reply {
        Reply::Ok if cli.json => output("{\"ok\":true}\n"),
        Reply::Ok => Ok(()),
        other => Err(unexpected(&other)),
    }
}

/// Writes to stdout; a reader that went away (`vale-ctl list | head`) is not an error.
fn output(text: &str) -> Result<(), Failure> {
    let mut out = io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => {
            Err(anyhow!("cannot write output: {e}").into())
        }
        _ => Ok(()),
    }
}

/// The request of `vale-ctl lookup`: show (no module) or set.
fn lookup_request(
    switch: &str,
    module: Option<&str>,
    args: &[(String, String)],
    access: &[String],
    trunk: &[String],
    default: Option<&str>,
) -> Result<Request, Failure> {
    Ok(match module {
        None => Request::Lookup {
            switch: switch.to_string(),
        },
        Some(module) => {
            let vlan_flags = !access.is_empty() || !trunk.is_empty() || default.is_some();
            if vlan_flags && module != "vlan" {
                return Err(Failure::Usage(
                    "--access, --trunk and --default configure the vlan module only".into(),
                ));
            }
            let mut all = vlan_args(switch, access, trunk, default).map_err(Failure::Usage)?;
            all.extend(args.iter().map(|(key, value)| ModuleArg {
                key: key.clone(),
                value: value.clone(),
            }));
            // valed resolves no path against our directory: send it absolute.
            let module = if module.contains('/') {
                let p = Path::new(module);
                std::path::absolute(p)
                    .unwrap_or_else(|_| p.to_path_buf())
                    .to_string_lossy()
                    .into_owned()
            } else {
                module.to_string()
            };
            Request::SetLookup {
                switch: switch.to_string(),
                module,
                args: all,
            }
        }
    })
}

/// `vale-ctl lookup valeX` as text.
fn render_lookup(l: &LookupInfo) -> String {
    let mut s = format!("{}  lookup {}  ({})\n", l.switch, l.module, l.source);
    for a in &l.args {
        s += &format!("  arg {}={}\n", a.key, a.value);
    }
    let w = l.counters.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in &l.counters {
        s += &format!("  {:<w$}  {}\n", c.name, c.value);
    }
    s
}

/// A switch to show, with its real number of ports (its `ports` may be filtered to one).
struct View {
    info: SwitchInfo,
    total_ports: usize,
}

/// Keeps what `list NAME` asked for: everything, one switch, or one port in its switch.
fn select(switches: Vec<SwitchInfo>, name: Option<&str>) -> Result<Vec<View>, Failure> {
    let mut views = switches.into_iter().map(|info| View {
        total_ports: info.ports.len(),
        info,
    });
    let Some(name) = name else {
        return Ok(views.collect());
    };
    let (sw_name, port) = match parse_port(name) {
        Ok((sw, _)) => (sw, Some(name)),
        Err(_) => (name, None),
    };
    let mut view = views
        .find(|v| v.info.name == sw_name)
        .ok_or_else(|| Failure::Refused(format!("no such switch '{sw_name}'")))?;
    if let Some(port) = port {
        view.info.ports.retain(|p| p.name == port);
        if view.info.ports.is_empty() {
            return Err(Failure::Refused(format!("no such port '{port}'")));
        }
    }
    Ok(vec![view])
}

/// Column titles, and whether each column holds numbers (right-aligned).
const COLUMNS: [(&str, bool); 20] = [
    ("NAME", false),
    ("KIND", false),
    ("DEVICE", false),
    ("STATE", false),
    ("UID", true),
    ("PID", true),
    ("PERSIST", false),
    ("RINGS", true),
    ("SLOTS", true),
    ("BUF", true),
    ("MOD(us)", true),
    ("LEARNT", true),
    ("TX-PKTS", true),
    ("TX-BYTES", true),
    ("RX-PKTS", true),
    ("RX-BYTES", true),
    ("RX-DROP", true),
    ("TX-DROP", true),
    ("BAD", true),
    ("NOLEARN", true),
];

fn port_row(p: &PortInfo) -> Vec<String> {
    // A port nobody holds has no memory, so no ring geometry to show.
    let mapped = p.tx_rings != 0 || p.rx_rings != 0;
    let geometry = |v: String| if mapped { v } else { "-".to_string() };
    let c = &p.counters;
    vec![
        p.name.clone(),
        p.kind.clone(),
        match (&p.device, &p.mode) {
            (Some(d), Some(m)) => format!("{d}/{m}"),
            (Some(d), None) => d.clone(),
            _ => "-".to_string(),
        },
        if p.state.is_empty() { "-" } else { &p.state }.to_string(),
        p.owner_uid.to_string(),
        p.owner_pid
            .map_or_else(|| "-".to_string(), |pid| pid.to_string()),
        if p.persistent { "yes" } else { "no" }.to_string(),
        geometry(format!("{}/{}", p.tx_rings, p.rx_rings)),
        geometry(p.slots.to_string()),
        geometry(p.buf_size.to_string()),
        p.moderation_us.to_string(),
        format!("{}/{}", p.learnt, p.learn_limit),
        c.tx_packets.to_string(),
        c.tx_bytes.to_string(),
        c.rx_packets.to_string(),
        c.rx_bytes.to_string(),
        c.rx_drops.to_string(),
        c.tx_drops.to_string(),
        c.bad_input.to_string(),
        c.learn_refused.to_string(),
    ]
}

/// The human form of `list`: per switch a header line and an indented port table, every
/// table aligned to the same column widths.
fn render(views: &[View]) -> String {
    let header: Vec<String> = COLUMNS.iter().map(|(t, _)| t.to_string()).collect();
    let rows: Vec<Vec<Vec<String>>> = views
        .iter()
        .map(|v| v.info.ports.iter().map(port_row).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows.iter().flatten() {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: &[String]| {
        let mut text = String::from(" ");
        for (i, cell) in cells.iter().enumerate() {
            let pad = " ".repeat(widths[i] - cell.chars().count());
            text.push(' ');
            if COLUMNS[i].1 {
                text.push_str(&pad);
                text.push_str(cell);
            } else {
                text.push_str(cell);
                text.push_str(&pad);
            }
            text.push(' ');
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    let mut out = String::new();
    for (i, (view, rows)) in views.iter().zip(&rows).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let sw = &view.info;
        out.push_str(&format!(
            "{}  lookup {}  batch {}  ports {}\n",
            sw.name, sw.lookup, sw.batch, view.total_ports
        ));
        if !rows.is_empty() {
            line(&mut out, &header);
            for row in rows {
                line(&mut out, row);
            }
        }
        for p in &sw.ports {
            if let Some(n) = &p.negotiated {
                out.push_str(&format!("  {}: {n}\n", p.name));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn port(name: &str, owner: Option<u32>) -> PortInfo {
        PortInfo {
            name: name.into(),
            kind: "native".into(),
            persistent: owner.is_none(),
            owner_pid: owner,
            tx_rings: if owner.is_some() { 1 } else { 0 },
            rx_rings: if owner.is_some() { 1 } else { 0 },
            slots: if owner.is_some() { 1024 } else { 0 },
            buf_size: if owner.is_some() { 2048 } else { 0 },
            ..Default::default()
        }
    }

    fn switches() -> Vec<SwitchInfo> {
        vec![
            SwitchInfo {
                name: "vale0".into(),
                lookup: "learning".into(),
                batch: 512,
                ports: vec![port("vale0:a", None), port("vale0:b", Some(4242))],
            },
            SwitchInfo {
                name: "vale1".into(),
                lookup: "hub".into(),
                batch: 64,
                ports: vec![port("vale1:long-port-name", Some(7))],
            },
        ]
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn names_are_checked() {
        assert!(Cli::try_parse_from(["vale-ctl", "create", "vale0"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "create", "vale0:a b"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "rm", "foo"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "ls", "vale0:a", "--json"]).is_ok());
        assert!(Cli::try_parse_from(["vale-ctl", "set", "vale0", "batch", "64"]).is_ok());
    }

    #[test]
    fn select_filters() {
        assert_eq!(select(switches(), None).ok().unwrap().len(), 2);
        let v = select(switches(), Some("vale1")).ok().unwrap();
        assert_eq!((v.len(), v[0].info.name.as_str()), (1, "vale1"));
        let v = select(switches(), Some("vale0:b")).ok().unwrap();
        assert_eq!((v[0].info.ports.len(), v[0].total_ports), (1, 2));
        assert_eq!(v[0].info.ports[0].name, "vale0:b");
        match select(switches(), Some("vale9")) {
            Err(Failure::Refused(m)) => assert_eq!(m, "no such switch 'vale9'"),
            _ => panic!(),
        }
        match select(switches(), Some("vale0:z")) {
            Err(Failure::Refused(m)) => assert_eq!(m, "no such port 'vale0:z'"),
            _ => panic!(),
        }
    }

    #[test]
    fn render_aligns() {
        let text = render(&select(switches(), None).ok().unwrap());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "vale0  lookup learning  batch 512  ports 2");
        assert!(lines[1].trim_start().starts_with("NAME"));
        assert!(lines[2].contains("  -  ") && lines[2].contains(" yes "));
        assert!(lines[3].contains(" 4242 ") && lines[3].contains(" 1/1 "));
        assert_eq!(lines[4], "");
        assert_eq!(lines[5], "vale1  lookup hub  batch 64  ports 1");
        // Every table line puts BAD's right edge in the same place.
        let ends: Vec<usize> = [1, 2, 3, 6, 7].iter().map(|&i| lines[i].len()).collect();
        assert!(ends.windows(2).all(|w| w[0] == w[1]), "{text}");
        assert_eq!(render(&[]), "");
    }

    #[test]
    fn lookup_requests() {
        let cli = Cli::try_parse_from([
            "vale-ctl",
            "lookup",
            "vale0",
            "vlan",
            "--access",
            "a=10",
            "--trunk",
            "vale0:up=10,20",
            "--default",
            "none",
            "--arg",
            "entries=64",
        ])
        .unwrap();
        let Command::Lookup {
            switch,
            module,
            args,
            access,
            trunk,
            default,
            ..
        } = cli.command
        else {
            panic!("not lookup")
        };
        let req = lookup_request(
            &switch,
            module.as_deref(),
            &args,
            &access,
            &trunk,
            default.as_deref(),
        );
        let Ok(Request::SetLookup { module, args, .. }) = req else {
            panic!("not set")
        };
        assert_eq!(module, "vlan");
        let kv: Vec<String> = args
            .iter()
            .map(|a| format!("{}={}", a.key, a.value))
            .collect();
        assert_eq!(
            kv,
            [
                "access=vale0:a=10",
                "trunk=vale0:up=10,20",
                "default=none",
                "entries=64"
            ]
        );
        // A path goes absolute; --arg needs a module; vlan flags need vlan.
        let Ok(Request::SetLookup { module, .. }) =
            lookup_request("vale0", Some("./m.so"), &[], &[], &[], None)
        else {
            panic!("not set")
        };
        assert!(
            module.starts_with('/') && module.ends_with("/m.so"),
            "{module}"
        );
        assert!(Cli::try_parse_from(["vale-ctl", "lookup", "vale0", "--arg", "a=b"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "lookup", "vale0", "--rules", "r"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "flow", "vale0", "add"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "flow", "vale0", "add", "--rules", "r"]).is_ok());
        assert!(Cli::try_parse_from(["vale-ctl", "flow", "vale0", "del"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "flow", "vale0:a", "dump"]).is_err());
        assert!(Cli::try_parse_from(["vale-ctl", "lookup", "vale0", "x", "--arg", "ab"]).is_err());
        assert!(matches!(
            lookup_request("vale0", Some("hub"), &[], &["a=1".into()], &[], None),
            Err(Failure::Usage(_))
        ));
        assert!(matches!(
            lookup_request("vale0", Some("vlan"), &[], &["vale1:a=1".into()], &[], None),
            Err(Failure::Usage(_))
        ));
    }
}
