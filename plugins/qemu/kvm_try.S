# The KVM try's guest (plugins/qemu/kvm.py; docs/architecture.md, "Virtual devices"): one boot
# sector that walks the steps a Linux kernel takes early and prints a letter on COM1 after each,
# then the marker. A nested hypervisor that runs real mode and dies later (at cmpxchg16b, say)
# is seen stopping there, not taken for a working KVM.
# Assembled with: as --64 -o t.o kvm_try.S && ld -Ttext=0x7c00 -e _start --oformat binary -o t.bin t.o
# (tests/test_qemu_config.py checks that kvm.py's bytes are this file's).
.code16
.globl _start
_start:
    cli
    xor %ax, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov $0x7c00, %sp
    mov $0x3f8, %dx
    mov $'r', %al                   # real mode
    out %al, %dx
    lgdtl gdtr
    mov %cr0, %eax
    or $1, %eax
    mov %eax, %cr0
    ljmpl $0x08, $protected
.code32
protected:
    mov $0x10, %ax
    mov %ax, %ds
    mov %ax, %es
    mov %ax, %ss
    mov $'p', %al                   # protected mode
    out %al, %dx
    mov $0x1000, %edi               # page tables at 0x1000-0x3fff: the first 2 MiB mapped as itself
    xor %eax, %eax
    mov $0xc00, %ecx
    rep stosl
    movl $0x2003, 0x1000
    movl $0x3003, 0x2000
    movl $0x83, 0x3000
    mov %cr4, %eax
    or $0x20, %eax                  # PAE
    mov %eax, %cr4
    mov $0x1000, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx           # EFER.LME: an MSR write
    rdmsr
    or $0x100, %eax
    wrmsr
    mov %cr0, %eax
    or $0x80000000, %eax            # paging on: long mode
    mov %eax, %cr0
    ljmp $0x18, $long
.code64
long:
    mov $0x3f8, %dx
    mov $'l', %al                   # long mode
    out %al, %dx
    xor %eax, %eax
    cpuid
    mov $0x3f8, %dx
    mov $'c', %al                   # cpuid
    out %al, %dx
    xor %eax, %eax
    xor %edx, %edx
    xor %ebx, %ebx
    xor %ecx, %ecx
    cmpxchg16b 0x4000
    mov $0x3f8, %dx
    mov $'x', %al                   # cmpxchg16b
    out %al, %dx
    lidt idtr
    int3                            # through the IDT's vector 3, which returns
    mov $0x3f8, %dx
    mov $'i', %al                   # int3
    out %al, %dx
    mov %cr4, %rax
    or $0x40600, %rax               # OSXSAVE, OSFXSR, OSXMMEXCPT
    mov %rax, %cr4
    xor %ecx, %ecx
    mov $3, %eax                    # x87 and SSE state
    xor %edx, %edx
    xsetbv
    xsave 0x5000
    xrstor 0x5000
    mov $0x3f8, %dx
    mov $'s', %al                   # xsave, xrstor
    out %al, %dx
    lea marker(%rip), %rsi
1:  lodsb
    test %al, %al
    jz 2f
    out %al, %dx
    jmp 1b
2:  cli
    hlt
    jmp 2b
breakpoint:
    iretq
marker:
    .asciz "DEVLOOP-KVM-OK"
.align 8
gdt:
    .quad 0
    .quad 0x00cf9a000000ffff        # 0x08: 32-bit code
    .quad 0x00cf92000000ffff        # 0x10: data
    .quad 0x00af9a000000ffff        # 0x18: 64-bit code
gdtr:
    .word 31
    .long gdt
idt:
    .fill 48, 1, 0                  # vectors 0-2: absent
    .word breakpoint                # vector 3: a 64-bit interrupt gate to breakpoint
    .word 0x18
    .byte 0
    .byte 0x8e
    .word 0
    .long 0
    .long 0
idtr:
    .word 63
    .quad idt
.org 510
    .byte 0x55, 0xaa
